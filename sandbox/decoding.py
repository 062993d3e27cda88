"""Decode untrusted result bytes in the trusted parent with work and memory linear in the input.

What it does: :func:`decode_result` reads the tagged encoding of ``codea1_core.values`` (same format,
same values as ``values.decode``, which ``tests/sandbox/test_sandbox.py`` checks) with two guards the plain
decoder does not need for trusted bytes:
  * hash flooding: before a set, frozenset or dict is built, the hashes of its keys are counted (in a
    dict keyed by the hash values themselves, which never collide there); more than
    :data:`MAX_SAME_HASH` keys sharing one hash is rejected, so building it, and comparing it later
    (``values_equal`` uses ``==`` on sets), costs at most that factor per key instead of the quadratic
    blow-up of colliding keys (a 100 x repeated set of 3000 colliding ints: one ``[s] * 100`` in the
    child, seconds of the parent's time when decoded naively);
  * memory: every object built is charged its real CPython size (``sys.getsizeof``; a container's
    floor is charged before it is built) against a :class:`DecodeBudget` shared by all calls of one
    program (``DECODED_PER_ENCODED_BYTE`` times its result cap), so the parent's memory per program,
    hence per batch, is bounded whatever the program returns (an encoding of a million empty sets is
    5 MB but would be 216 MB of objects);
  * time: the same budget holds the program's decode time (``ExecLimits.max_decode_s`` of the decoding
    thread's CPU); past it the call, and every later call of the program, is ``unsupported_output``.

Rejections raise :class:`ResultRejected` (the call is ``unsupported_output``); malformed bytes raise
``ValueError`` as in ``values.decode``. :func:`outcomes_of` turns one program's reported calls into
``CallOutcome`` objects this way (shared by the process and Docker backends). What it does not do: encode,
compare, or run any code of the
program (no ``__hash__``/``__eq__`` of user classes can be reached: only plain types are built).
"""

from __future__ import annotations

import struct
import sys
import time
from typing import Any

from codea1_core.types import CallOutcome
from codea1_core.values import MAX_DEPTH
from sandbox.limits import ExecLimits

MAX_SAME_HASH = 32
"""Most keys of one set/frozenset/dict allowed to share one hash value (natural data: 1 or 2)."""
DECODED_PER_ENCODED_BYTE = 4
"""Decoded-object bytes a program may cost per byte of its result cap (1 GiB at the default cap; a
list of ints costs ~4.4 x its encoding, of 1-character strings ~10 x, of empty sets ~43 x)."""

_cpu = time.thread_time  # the decoding thread's own CPU: a loaded machine does not shorten the cap
_size = sys.getsizeof
_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_L = struct.Struct(">I")
_CONTAINER_TAGS = frozenset(b"ltSZd")
# A floor of each container's size charged before it is built (empty list, tuple, set, frozenset, dict;
# per item), then ``sys.getsizeof`` of what was built: CPython's real size, hash tables and
# over-allocation included (``tests/sandbox/test_sandbox_deny.py`` checks the charges against tracemalloc).
_BASE_BYTES = {0x6C: 56, 0x74: 40, 0x53: 216, 0x5A: 216, 0x64: 64}
_ITEM_BYTES = {0x6C: 8, 0x74: 8, 0x53: 16, 0x5A: 16, 0x64: 16}
_EMPTY = {0x6C: list, 0x74: tuple, 0x53: set, 0x5A: frozenset, 0x64: dict}
_EMPTY_BYTES = {tag: sys.getsizeof(make()) for tag, make in _EMPTY.items()}
_INT_BYTES = 32  # an int object of up to 60 bits, as allocated (28 or 32 bytes, 8-byte aligned)


class ResultRejected(ValueError):
    """Well-formed result the parent refuses to build (hash flooding, too many decoded bytes)."""


class DecodeBudget:
    """Decoded bytes and CPU seconds one program may still cost the parent (shared by its calls)."""

    def __init__(self, result_cap_bytes: int, max_cpu_s: float | None = None) -> None:
        self.left = result_cap_bytes * DECODED_PER_ENCODED_BYTE
        self.deadline = None if max_cpu_s is None else _cpu() + max_cpu_s
        self.max_cpu_s = max_cpu_s
        self._ticks = 0
        self.spent = "result too large (decoded size over the program's budget)"

    def charge(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left < 0:
            raise ResultRejected(self.spent)
        self._ticks += 1
        if self._ticks & 1023 == 0:
            self.check_time()

    def check_time(self) -> None:
        """Raise once the program's decode time is spent (checked every 1,024 objects)."""
        if self.deadline is not None and _cpu() > self.deadline:
            self.left = -1  # every later call of the program is refused at once
            self.spent = f"decode time over the program's cap ({self.max_cpu_s} s of parent CPU)"
            raise ResultRejected(self.spent)


def decode_result(data: bytes, budget: DecodeBudget) -> Any:
    """Decode ``data`` (as ``values.decode``) charging ``budget``; see the module docstring.

    Raises:
        ResultRejected: hash-flooded keys or over budget.
        ValueError: malformed bytes.
    """
    view = memoryview(data)
    if budget.left < 0:
        raise ResultRejected(budget.spent)
    budget.check_time()
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
        value = _Q.unpack_from(view, pos)[0]
        budget.charge(0 if -5 <= value <= 256 else _INT_BYTES)  # (small ints are shared, not built)
        return value, pos + 8
    if tag == 0x73:  # s
        (n,) = _L.unpack_from(view, pos)
        text = _take(view, pos + 4, n).decode("utf-8", "surrogatepass")
        budget.charge(_size(text))
        return text, pos + 4 + n
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
        raw = _take(view, pos + 4, n)
        value = int.from_bytes(raw, "big", signed=True) if tag == 0x49 else raw
        budget.charge(_size(value))
        return value, pos + 4 + n
    raise ValueError(f"unknown tag {tag:#x} at byte {pos - 1}")


def _dec_container(view: memoryview, tag: int, pos: int, depth: int, budget: DecodeBudget) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    (n,) = _L.unpack_from(view, pos)
    pos += 4
    if n == 0:  # (common in flooding results: one call, a charge, no hash check)
        budget.charge(_EMPTY_BYTES[tag])
        return _EMPTY[tag](), pos
    if n > len(view) - pos:  # every item takes at least one byte
        raise ValueError("truncated container")
    floor = _BASE_BYTES[tag] + _ITEM_BYTES[tag] * n  # at most what CPython will allocate for it
    budget.charge(floor)  # before building: nothing larger than the budget is ever built
    items = []
    for _ in range(n * 2 if tag == 0x64 else n):
        item, pos = _dec(view, pos, depth + 1, budget)
        items.append(item)
    if tag == 0x6C:
        value: Any = items
    elif tag == 0x74:
        value = tuple(items)
    else:
        keys = items[0::2] if tag == 0x64 else items
        _check_hash_spread(keys)
        if tag == 0x64:
            value = dict(zip(keys, items[1::2], strict=True))
        else:
            value = set(items) if tag == 0x53 else frozenset(items)
    budget.charge(max(_size(value) - floor, 0))  # then its real size (hash tables, over-allocation)
    return value, pos


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
    budget = DecodeBudget(limits.max_result_bytes, limits.max_decode_s)
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
