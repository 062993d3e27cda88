"""Decode untrusted result bytes in the trusted parent with work and memory linear in the input.

What it does: :func:`decode_result` reads the tagged encoding of ``codea1_core.values`` (same format,
same values as ``values.decode``, which ``tests/test_sandbox.py`` checks) with two guards the plain
decoder does not need for trusted bytes:
  * hash flooding: before a set, frozenset or dict is built, the hashes of its keys are counted (in a
    dict keyed by the hash values themselves, which never collide there); more than
    :data:`MAX_SAME_HASH` keys sharing one hash is rejected, so building it, and comparing it later
    (``values_equal`` uses ``==`` on sets), costs at most that factor per key instead of the quadratic
    blow-up of colliding keys (a 100 x repeated set of 3000 colliding ints: one ``[s] * 100`` in the
    child, seconds of the parent's time when decoded naively);
  * memory: every object built is charged an estimate of its size against a :class:`DecodeBudget`
    shared by all calls of one program (``DECODED_PER_ENCODED_BYTE`` times its result cap), so the
    parent's memory per program, hence per batch, is bounded whatever the program returns (an encoding
    of a million empty sets is 5 MB but would be 216 MB of objects).

Rejections raise :class:`ResultRejected` (the call is ``unsupported_output``); malformed bytes raise
``ValueError`` as in ``values.decode``. :func:`outcomes_of` turns one program's reported calls into
``CallOutcome`` objects this way (shared by the process and Docker backends). What it does not do: encode, compare, or run any code of the
program (no ``__hash__``/``__eq__`` of user classes can be reached: only plain types are built).
"""

from __future__ import annotations

import struct
from typing import Any

from codea1_core.types import CallOutcome
from codea1_core.values import MAX_DEPTH
from sandbox.limits import ExecLimits

MAX_SAME_HASH = 32
"""Most keys of one set/frozenset/dict allowed to share one hash value (natural data: 1 or 2)."""
DECODED_PER_ENCODED_BYTE = 4
"""Decoded-object bytes a program may cost per byte of its result cap (1 GiB at the default cap; a
list of ints costs ~4.4 x its encoding, of 1-character strings ~10 x, of empty sets ~43 x)."""

_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_L = struct.Struct(">I")
_CONTAINER_TAGS = frozenset(b"ltSZd")
_BASE_BYTES = {0x6C: 56, 0x74: 40, 0x53: 216, 0x5A: 216, 0x64: 64}  # empty list, tuple, set, frozenset, dict
_ITEM_BYTES = {0x6C: 8, 0x74: 8, 0x53: 40, 0x5A: 40, 0x64: 48}  # per item (hash tables: slack included)


class ResultRejected(ValueError):
    """Well-formed result the parent refuses to build (hash flooding, too many decoded bytes)."""


class DecodeBudget:
    """Decoded bytes one program may still cost the parent (shared by the calls of that program)."""

    def __init__(self, result_cap_bytes: int) -> None:
        self.left = result_cap_bytes * DECODED_PER_ENCODED_BYTE

    def charge(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left < 0:
            raise ResultRejected("result too large (decoded size over the program's budget)")


def decode_result(data: bytes, budget: DecodeBudget) -> Any:
    """Decode ``data`` (as ``values.decode``) charging ``budget``; see the module docstring.

    Raises:
        ResultRejected: hash-flooded keys or over budget.
        ValueError: malformed bytes.
    """
    view = memoryview(data)
    try:
        value, pos = _dec(view, 0, 0, budget)
    except ResultRejected:
        raise
    except (struct.error, IndexError, UnicodeDecodeError, TypeError, RecursionError, ValueError) as exc:
        raise ValueError(f"malformed value encoding: {type(exc).__name__}: {exc}") from None
    if pos != len(view):
        raise ValueError(f"malformed value encoding: {len(view) - pos} trailing bytes")
    return value


def _take(view: memoryview, pos: int, n: int) -> bytes:
    if pos + n > len(view):
        raise ValueError("truncated")
    return view[pos : pos + n].tobytes()


def _dec(view: memoryview, pos: int, depth: int, budget: DecodeBudget) -> tuple[Any, int]:
    tag = view[pos]
    pos += 1
    if tag in _CONTAINER_TAGS:
        return _dec_container(view, tag, pos, depth, budget)
    if tag == 0x69:  # i
        budget.charge(32)
        return _Q.unpack_from(view, pos)[0], pos + 8
    if tag == 0x73:  # s
        (n,) = _L.unpack_from(view, pos)
        budget.charge(80 + n)  # a str takes at most as many bytes per character as UTF-8 does
        return _take(view, pos + 4, n).decode("utf-8", "surrogatepass"), pos + 4 + n
    if tag == 0x66:  # f
        budget.charge(24)
        return _D.unpack_from(view, pos)[0], pos + 8
    if tag == 0x63:  # c
        budget.charge(32)
        return complex(_D.unpack_from(view, pos)[0], _D.unpack_from(view, pos + 8)[0]), pos + 16
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x49 or tag == 0x62:  # I b
        (n,) = _L.unpack_from(view, pos)
        budget.charge(40 + n)
        raw = _take(view, pos + 4, n)
        return (int.from_bytes(raw, "big", signed=True) if tag == 0x49 else raw), pos + 4 + n
    raise ValueError(f"unknown tag {tag:#x} at byte {pos - 1}")


def _dec_container(view: memoryview, tag: int, pos: int, depth: int, budget: DecodeBudget) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    (n,) = _L.unpack_from(view, pos)
    pos += 4
    if n > len(view) - pos:  # every item takes at least one byte
        raise ValueError("truncated container")
    budget.charge(_BASE_BYTES[tag] + _ITEM_BYTES[tag] * n)  # ~ sys.getsizeof of the container built
    items = []
    for _ in range(n * 2 if tag == 0x64 else n):
        item, pos = _dec(view, pos, depth + 1, budget)
        items.append(item)
    if tag == 0x6C:
        return items, pos
    if tag == 0x74:
        return tuple(items), pos
    keys = items[0::2] if tag == 0x64 else items
    _check_hash_spread(keys)
    if tag == 0x64:
        return dict(zip(keys, items[1::2], strict=True)), pos
    return (set(items) if tag == 0x53 else frozenset(items)), pos


def _check_hash_spread(keys: list) -> None:
    """Reject keys of which more than :data:`MAX_SAME_HASH` share one hash (hash flooding)."""
    if len(keys) <= MAX_SAME_HASH:
        return
    counts: dict[int, int] = {}
    for key in keys:
        h = hash(key)  # TypeError for an unhashable key: malformed, as in values.decode
        c = counts.get(h, 0) + 1
        if c > MAX_SAME_HASH:
            raise ResultRejected(f"hash-colliding set/dict keys (more than {MAX_SAME_HASH} share one hash)")
        counts[h] = c


def outcomes_of(calls: list[tuple], limits: ExecLimits) -> list[CallOutcome]:
    """Decode one program's reported calls, all charged to one decode budget (bounded parent memory)."""
    budget = DecodeBudget(limits.max_result_bytes)
    return [_to_outcome(c, budget) for c in calls]


def _to_outcome(call: tuple, budget: DecodeBudget | None = None) -> CallOutcome:
    status, payload, error, dur_s = call
    if status != "ok":
        return CallOutcome(status, None, error, dur_s)
    try:
        value = decode_result(payload, budget or DecodeBudget(ExecLimits().max_result_bytes))
        return CallOutcome("ok", value, "", dur_s)
    except ResultRejected as exc:
        return CallOutcome("unsupported_output", None, f"UnsupportedValue: {exc}", dur_s)
    except ValueError as exc:  # only a forged frame can carry bytes our encoder did not write
        return CallOutcome("error", None, f"SandboxViolation: {exc}", dur_s)
