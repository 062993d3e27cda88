"""Tests of codea1_core.values: the plain-value codec, the trusted comparison and source literals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codea1_core.values import MAX_DEPTH, UnsupportedValue, decode, encode, to_literal, values_equal

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.complex_numbers() | st.text() | st.binary()
)
hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=8,
)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(hashables, inner, max_size=3)
        | st.sets(hashables, max_size=3)
        | st.frozensets(hashables, max_size=3)
    ),
    max_leaves=20,
)


def same(a, b) -> bool:
    """Structural identity: same types all the way down, NaN matches NaN, -0.0 keeps its sign."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is complex:
        return same(a.real, b.real) and same(a.imag, b.imag)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=150, deadline=None)
@given(plain)
def test_encode_decode_round_trip(value):
    assert same(decode(encode(value)), value)


@settings(max_examples=150, deadline=None)
@given(plain)
def test_to_literal_evaluates_back(value):
    assert same(eval(to_literal(value)), value)  # noqa: S307 - the literal is ours


@pytest.mark.parametrize(
    "value",
    [
        2**200,
        -(2**64),
        10**5000,  # beyond Python's 4300-digit str/int limit
        -(10**5000) + 7,
        float("nan"),
        float("inf"),
        -0.0,
        "\ud800 lone surrogate",
        b"\x00\xff",
        set(),
        frozenset(),
        (),
        (1,),
        {(1, 2): frozenset({3})},
        complex(float("inf"), -0.0),
        [1j, -2.5 + 0j],
    ],
    ids=lambda v: type(v).__name__,
)
def test_edge_values_round_trip(value):
    assert same(decode(encode(value)), value)
    assert same(eval(to_literal(value)), value)  # noqa: S307


def test_subclasses_and_objects_are_unsupported():
    class EvilInt(int):
        def __eq__(self, other):
            return True

    class EvilList(list):
        pass

    for value in (EvilInt(3), EvilList([1]), object(), [1, EvilInt(2)], {1: object()}, range(3)):
        with pytest.raises(UnsupportedValue):
            encode(value)
        with pytest.raises(UnsupportedValue):
            to_literal(value)


def test_stdlib_mappings_encode_as_plain_dicts():
    import collections

    class Meta(type):
        def __eq__(cls, other):
            return True

        __hash__ = type.__hash__

    class Impostor(metaclass=Meta):
        pass

    assert decode(encode(collections.Counter("abca"))) == {"a": 2, "b": 1, "c": 1}
    assert type(decode(encode(collections.OrderedDict(x=1)))) is dict
    assert eval(to_literal(collections.defaultdict(list, k=[1]))) == {"k": [1]}  # noqa: S307
    with pytest.raises(UnsupportedValue):
        encode(Impostor())


def test_self_reference_and_depth_are_unsupported():
    loop: list = []
    loop.append(loop)
    with pytest.raises(UnsupportedValue, match="nested deeper"):
        encode(loop)
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(UnsupportedValue):
        encode(deep)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"i\x00",
        b"X",
        b"s\x00\x00\x00\x05ab",
        b"NN",
        b"l\xff\xff\xff\xff",
        b"S\x00\x00\x00\x01l\x00\x00\x00\x00",
    ],
)
def test_decode_rejects_malformed_bytes(data):
    with pytest.raises(ValueError, match="malformed"):
        decode(data)


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1.0, True),
        (True, 1, True),
        (False, 0.0, True),
        (0.1 + 0.2, 0.3, True),
        (1.0, 1.0 + 1e-3, False),
        (1e-9, 0.0, True),  # absolute tolerance
        (1e12, 1e12 + 1.0, True),  # relative tolerance
        (float("nan"), float("nan"), False),
        (float("inf"), float("inf"), True),
        (float("inf"), float("-inf"), False),
        (10**400, 1e300, False),  # int beyond float range
        (10**400, 10**400, True),
        ([1, 2.0000001], [1, 2], True),
        ([1, 2], (1, 2), False),  # Python semantics: list != tuple
        ((1, [2.0]), (1, [2.0000000001]), True),
        ({"a": 1.0000001}, {"a": 1}, True),
        ({"a": 1}, {"b": 1}, False),
        ({1: 1}, {1.0: 1}, True),
        ({1, 2}, frozenset({1, 2}), True),
        ({0.1 + 0.2}, {0.3}, False),  # sets: exact (hash-based)
        ("a", b"a", False),
        (None, None, True),
        (1 + 2j, 1.0000001 + 2j, True),
        (2 + 0j, 2, True),
        (1j, 2j, False),
        (complex(float("nan"), 0), complex(float("nan"), 0), False),
        (None, 0, False),
        ("1", 1, False),
        ([float("nan")], [float("nan")], False),
    ],
)
def test_values_equal(a, b, equal):
    assert values_equal(a, b) is equal
    assert values_equal(b, a) is equal


def test_values_equal_tolerance_is_configurable():
    assert not values_equal(0.1 + 0.2, 0.3, rel_tol=0.0, abs_tol=0.0)
    assert values_equal(1.0, 1.05, rel_tol=0.1)


def test_to_literal_forms():
    assert to_literal(float("nan")) == "float('nan')"
    assert to_literal(float("-inf")) == "float('-inf')"
    assert to_literal(set()) == "set()"
    assert to_literal(frozenset()) == "frozenset()"
    assert to_literal((1,)) == "(1,)"
    assert to_literal({"k": [1, (2,)]}) == "{'k': [1, (2,)]}"
    assert to_literal(10**5000).startswith("0x")
