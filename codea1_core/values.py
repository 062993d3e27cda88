"""Safe codec for plain values, the trusted tolerant comparison, and source literals (docs/method.md D2).

What it does:
  * :func:`encode` turns a *plain* value into compact tagged bytes. Plain means exactly (``type(x) is``)
    None, bool, int (any size), float (incl. nan/±inf/-0.0), complex (MBPP+ takes and returns some),
    str (lone surrogates kept), bytes, list, tuple, dict, set, frozenset, nested up to :data:`MAX_DEPTH`.
    Subclasses are rejected because a subclass can override ``__eq__``/``__hash__``; the one exception
    is the stdlib mappings ``collections.Counter``/``OrderedDict``/``defaultdict`` (MBPP+ returns
    Counters), encoded as plain dicts through ``dict.items`` (so no method of theirs runs). Encoding
    never runs code of the value's author.
  * :func:`decode` is the inverse; it never uses pickle or eval, and malformed bytes raise
    :class:`ValueError` (so untrusted bytes can be decoded safely).
  * :func:`values_equal` is the comparison done in the trusted parent (D2, §18.2): Python semantics
    (NaN != NaN, 1 == 1.0, True == 1, list != tuple) plus a float tolerance when either side is a float;
    containers element-wise, dicts by exact key match then tolerant values, sets by Python ``==``.
  * :func:`to_literal` gives a Python source literal that evaluates back to the value (Mistake Book, UI).

What it does not do: run anything, know about processes, or accept user classes (dataclasses, numpy
scalars, ...): those are ``UnsupportedValue`` by design.

Used by the sandbox child (encode), the trusted parent (decode, values_equal) and core (to_literal).
Run its tests with ``pytest tests/core/test_values.py``.
"""

from __future__ import annotations

import collections
import math
import struct
from typing import Any

__all__ = ["MAX_DEPTH", "UnsupportedValue", "decode", "encode", "to_literal", "values_equal"]

MAX_DEPTH = 256
"""Deepest container nesting accepted by encode/decode (also stops self-referential containers)."""

# Builtins bound once: the sandbox child encodes after untrusted code ran, which may have patched
# ``builtins`` (module globals are looked up before builtins).
_type = type
_len = len
_int = int
_str = str
_bytes = bytes
_float = float
_complex = complex
_list = list
_tuple = tuple
_dict = dict
_set = set
_frozenset = frozenset
_NoneType = type(None)
_dict_items = dict.items
_COUNTER, _ORDERED, _DEFAULT = collections.Counter, collections.OrderedDict, collections.defaultdict
_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_L = struct.Struct(">I")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_BIGINT_LITERAL_BITS = 12000  # ~3600 digits; Python refuses decimal int<->str beyond 4300 digits


class UnsupportedValue(TypeError):
    """The value is not plain data (or is nested deeper than :data:`MAX_DEPTH`)."""


# --------------------------------------------------------------------------------------------------
# encode
# --------------------------------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """Encode a plain value as bytes.

    Args:
        value: None, bool, int, float, str, bytes, list, tuple, dict, set or frozenset (exact types),
            nested up to :data:`MAX_DEPTH`.

    Returns:
        The tagged binary encoding (round-trips through :func:`decode`).

    Raises:
        UnsupportedValue: for any other type, a subclass of these, or too deep nesting.
    """
    out: list[bytes] = []
    _enc(value, out, 0)
    return b"".join(out)


def _enc(v: Any, out: list[bytes], depth: int) -> None:
    t = _type(v)
    if t is _int:
        if _INT64_MIN <= v <= _INT64_MAX:
            out.append(b"i" + _Q.pack(v))
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
            out.append(b"I" + _L.pack(_len(raw)) + raw)
    elif t is _str:
        raw = v.encode("utf-8", "surrogatepass")
        out.append(b"s" + _L.pack(_len(raw)) + raw)
    elif t is _float:
        out.append(b"f" + _D.pack(v))
    elif t is _complex:
        out.append(b"c" + _D.pack(v.real) + _D.pack(v.imag))
    elif v is None:
        out.append(b"N")
    elif v is True:
        out.append(b"T")
    elif v is False:
        out.append(b"F")
    elif t is _bytes:
        out.append(b"b" + _L.pack(_len(v)) + v)
    elif t is _list or t is _tuple or t is _set or t is _frozenset:
        if depth >= MAX_DEPTH:
            raise UnsupportedValue(f"nested deeper than {MAX_DEPTH}")
        tag = b"l" if t is _list else b"t" if t is _tuple else b"S" if t is _set else b"Z"
        items = _tuple(v)  # a snapshot: never iterate a container that may change under us
        out.append(tag + _L.pack(_len(items)))
        for item in items:
            _enc(item, out, depth + 1)
    elif t is _dict or t is _COUNTER or t is _ORDERED or t is _DEFAULT:  # identity: no metaclass __eq__
        if depth >= MAX_DEPTH:
            raise UnsupportedValue(f"nested deeper than {MAX_DEPTH}")
        items = _tuple(_dict_items(v))
        out.append(b"d" + _L.pack(_len(items)))
        for key, item in items:
            _enc(key, out, depth + 1)
            _enc(item, out, depth + 1)
    else:
        raise UnsupportedValue(f"not plain data: {_type_name(t)}")


def _type_name(t: type) -> str:
    try:
        name = _type.__getattribute__(t, "__qualname__")
        module = _type.__getattribute__(t, "__module__")
        return f"{module}.{name}" if module != "builtins" else _str(name)
    except Exception:  # a hostile metaclass: never let naming fail
        return "<unnamed type>"


# --------------------------------------------------------------------------------------------------
# decode
# --------------------------------------------------------------------------------------------------


def decode(data: bytes) -> Any:
    """Decode bytes produced by :func:`encode`.

    Raises:
        ValueError: the bytes are malformed (truncated, trailing data, unknown tag, unhashable set
            element or dict key, too deep).
    """
    view = memoryview(data)
    try:
        value, pos = _dec(view, 0, 0)
    except (struct.error, IndexError, UnicodeDecodeError, TypeError, RecursionError) as exc:
        raise ValueError(f"malformed value encoding: {type(exc).__name__}: {exc}") from None
    if pos != len(view):
        raise ValueError(f"malformed value encoding: {len(view) - pos} trailing bytes")
    return value


def _take(view: memoryview, pos: int, n: int) -> bytes:
    end = pos + n
    if end > len(view):
        raise ValueError("malformed value encoding: truncated")
    return view[pos:end].tobytes()


def _dec(view: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    tag = view[pos]
    pos += 1
    if tag == 0x69:  # i
        return _Q.unpack_from(view, pos)[0], pos + 8
    if tag == 0x73:  # s
        (n,) = _L.unpack_from(view, pos)
        return _take(view, pos + 4, n).decode("utf-8", "surrogatepass"), pos + 4 + n
    if tag == 0x66:  # f
        return _D.unpack_from(view, pos)[0], pos + 8
    if tag == 0x63:  # c
        return complex(_D.unpack_from(view, pos)[0], _D.unpack_from(view, pos + 8)[0]), pos + 16
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x49:  # I
        (n,) = _L.unpack_from(view, pos)
        return int.from_bytes(_take(view, pos + 4, n), "big", signed=True), pos + 4 + n
    if tag == 0x62:  # b
        (n,) = _L.unpack_from(view, pos)
        return _take(view, pos + 4, n), pos + 4 + n
    if tag in (0x6C, 0x74, 0x53, 0x5A, 0x64):  # l t S Z d
        if depth >= MAX_DEPTH:
            raise ValueError(f"malformed value encoding: nested deeper than {MAX_DEPTH}")
        (n,) = _L.unpack_from(view, pos)
        pos += 4
        if n > len(view) - pos:  # every item takes at least one byte
            raise ValueError("malformed value encoding: truncated container")
        if tag == 0x64:
            out: dict = {}
            for _ in range(n):
                key, pos = _dec(view, pos, depth + 1)
                out[key], pos = _dec(view, pos, depth + 1)
            return out, pos
        items = []
        for _ in range(n):
            item, pos = _dec(view, pos, depth + 1)
            items.append(item)
        if tag == 0x6C:
            return items, pos
        if tag == 0x74:
            return tuple(items), pos
        return (set(items) if tag == 0x53 else frozenset(items)), pos
    raise ValueError(f"malformed value encoding: unknown tag {tag:#x} at byte {pos - 1}")


# --------------------------------------------------------------------------------------------------
# values_equal
# --------------------------------------------------------------------------------------------------

_NUMBER_TYPES = (int, float, bool, complex)


def values_equal(a: Any, b: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Trusted comparison of two decoded plain values (docs/method.md D2, §18.2).

    Python ``==`` semantics, except that when either side of a numeric pair is a float the comparison
    is ``math.isclose`` with the given tolerances (NaN never equals anything, ±inf only itself).
    Lists/tuples compare element-wise and never equal each other; dicts need the exact same keys and
    tolerant values; sets/frozensets use Python ``==`` (hash-based, no tolerance).
    """
    ta, tb = type(a), type(b)
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        if ta is complex or tb is complex:
            try:
                ca, cb = complex(a), complex(b)
            except OverflowError:
                return a == b
            return _floats_close(ca.real, cb.real, rel_tol, abs_tol) and _floats_close(
                ca.imag, cb.imag, rel_tol, abs_tol
            )
        if ta is float or tb is float:
            return _floats_close(a, b, rel_tol, abs_tol)
        return a == b
    if ta in (list, tuple) or tb in (list, tuple):
        if ta is not tb or len(a) != len(b):
            return False
        return all(values_equal(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=True))
    if ta is dict or tb is dict:
        if ta is not tb or a.keys() != b.keys():
            return False
        return all(values_equal(a[k], b[k], rel_tol, abs_tol) for k in a)
    return a == b


def _floats_close(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    try:
        fa, fb = float(a), float(b)
    except OverflowError:  # an int beyond float range against a float: Python's exact comparison
        return a == b
    if math.isnan(fa) or math.isnan(fb):
        return False
    if math.isinf(fa) or math.isinf(fb):
        return a == b
    return math.isclose(fa, fb, rel_tol=rel_tol, abs_tol=abs_tol)


# --------------------------------------------------------------------------------------------------
# to_literal
# --------------------------------------------------------------------------------------------------


def to_literal(value: Any) -> str:
    """Python source that evaluates back to ``value`` (same type, equal value; NaN stays NaN).

    Raises:
        UnsupportedValue: for anything :func:`encode` rejects.
    """
    return _lit(value, 0)


def _lit(v: Any, depth: int) -> str:
    t = type(v)
    if v is None or t is bool or t is str or t is bytes:
        return repr(v)
    if t is int:
        if v.bit_length() > _BIGINT_LITERAL_BITS:  # hex literals have no digit limit
            return ("-" if v < 0 else "") + hex(abs(v))
        return repr(v)
    if t is float:
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if t is complex:
        return f"complex({_lit(v.real, depth)}, {_lit(v.imag, depth)})"
    if depth >= MAX_DEPTH:
        raise UnsupportedValue(f"nested deeper than {MAX_DEPTH}")
    if t is list:
        return "[" + ", ".join(_lit(x, depth + 1) for x in v) + "]"
    if t is tuple:
        inner = ", ".join(_lit(x, depth + 1) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if t is dict or t is _COUNTER or t is _ORDERED or t is _DEFAULT:
        return "{" + ", ".join(f"{_lit(k, depth + 1)}: {_lit(x, depth + 1)}" for k, x in dict.items(v)) + "}"
    if t is set:
        return "{" + ", ".join(_lit(x, depth + 1) for x in v) + "}" if v else "set()"
    if t is frozenset:
        return "frozenset({" + ", ".join(_lit(x, depth + 1) for x in v) + "})" if v else "frozenset()"
    raise UnsupportedValue(f"not plain data: {_type_name(t)}")
