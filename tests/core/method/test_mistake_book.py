"""Mistake Book worked examples (docs/method.md §8, D6): epochs, tie-breaks, cap, serialization, invariants"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codea1_core.config import MistakeBookConfig
from codea1_core.method.mistake_book import SCHEMA, MistakeBook, canonical_call
from codea1_core.types import TestCase


def T(call: str, expected=0) -> TestCase:  # noqa: N802 - short constructor for readable scenarios
    return TestCase(call=call, expected=expected)


def calls(tests: list[TestCase]) -> list[str]:
    return [t.call for t in tests]


def freqs(book: MistakeBook, pid: str) -> dict[str, int]:
    return {e.call: e.frequency for e in book.entries(pid)}


# --------------------------------------------------------------------------------------------------
# Three epochs, each problem visited once per epoch (§8 "Timing across epochs")
# --------------------------------------------------------------------------------------------------


def test_three_epoch_dynamics():
    book = MistakeBook(top_k=8, tie_break="recent", max_per_problem=0)
    a, b, c, d, e = T("f(1)", 2), T("f(2)", 3), T("g('x')", "X"), T("g('')", ""), T("f(3)", 4)

    # epoch 1: nothing to replay anywhere; failures enter the book (duplicates count)
    assert book.retrieve("P") == [] and book.retrieve("Q") == []
    assert book.update("P", failed=[a, a, b], passed=[], iteration=0) == {
        "added": 2,
        "incremented": 1,
        "decremented": 0,
        "removed": 0,
        "evicted": 0,
        "size": 2,
    }
    assert book.retrieve("Q") == []
    book.update("Q", failed=[c], passed=[], iteration=1)
    assert freqs(book, "P") == {"f(1)": 2, "f(2)": 1} and freqs(book, "Q") == {"g('x')": 1}

    # epoch 2: replay shows up; two valid codes pass c -> one decrement deletes it, the second is ignored
    assert book.retrieve("Q") == [c]
    counts = book.update("Q", failed=[d], passed=[c, c], iteration=2)
    assert (counts["decremented"], counts["removed"], counts["added"], counts["size"]) == (1, 1, 1, 1)
    assert freqs(book, "Q") == {"g('')": 1}
    assert book.retrieve("P") == [a, b]  # highest frequency first
    # one code passes a on replay (-1); a is generated again and fails (+1); e is new; a replayed b that
    # fails is NOT passed in and stays at 1
    counts = book.update("P", failed=[e, a], passed=[a], iteration=3)
    assert (counts["decremented"], counts["incremented"], counts["added"]) == (1, 1, 1)
    assert freqs(book, "P") == {"f(1)": 2, "f(2)": 1, "f(3)": 1}
    assert {x.call: x.last_seen for x in book.entries("P")} == {"f(1)": 3, "f(2)": 0, "f(3)": 3}
    assert {x.call: x.first_seen for x in book.entries("P")} == {"f(1)": 0, "f(2)": 0, "f(3)": 3}

    # epoch 3: a tie at the cut-off goes to the most recent entry (ours)
    assert book.retrieve("P", k=2) == [a, e]
    counts = book.update("P", failed=[], passed=[a, a, a], iteration=4)
    assert (counts["decremented"], counts["removed"]) == (2, 1)
    assert freqs(book, "P") == {"f(2)": 1, "f(3)": 1}
    assert book.size() == 3 and book.size("P") == 2 and book.problems() == ["P", "Q"]
    assert book.stats() == {
        "problems": 2.0,
        "entries": 3.0,
        "frequency_total": 3.0,
        "frequency_max": 1.0,
        "frequency_mean": 1.0,
    }


def test_a_problem_that_empties_leaves_the_book():
    book = MistakeBook()
    book.update("P", [T("f(1)")], [], 0)
    book.update("P", [], [T("f(1)")], 1)
    assert book.problems() == [] and book.size() == 0 and book.retrieve("P") == []


# --------------------------------------------------------------------------------------------------
# Tie-break modes
# --------------------------------------------------------------------------------------------------


def _tie_scenario(tie_break: str) -> MistakeBook:
    book = MistakeBook(tie_break=tie_break, max_per_problem=0)
    x, y, z, w = T("f(1)"), T("f(2)"), T("f(3)"), T("f(4)")
    book.update("P", [x, y, z], [], 0)
    book.update("P", [z], [], 1)  # z: 2
    assert calls(book.retrieve("P", 3)) == ["f(3)", "f(1)", "f(2)"]  # both modes: frequency first
    book.update("P", [w], [z], 2)  # z back to 1: everything ties at 1; w is new
    return book


def test_official_tie_break_follows_previous_retrieval_then_new_entries():
    book = _tie_scenario("official")
    # ties keep the previous retrieval's ranking (z, x, y), then w; neither insertion order (x, y)
    # nor recency (w, z)
    assert calls(book.retrieve("P", 2)) == ["f(3)", "f(1)"]
    assert calls(book.retrieve("P", 4)) == ["f(3)", "f(1)", "f(2)", "f(4)"]
    assert [e.call for e in book.entries("P")] == ["f(3)", "f(1)", "f(2)", "f(4)"]  # re-sorted in place


def test_official_tie_break_is_not_insertion_order():
    book = MistakeBook(tie_break="official", max_per_problem=0)
    x, y, z = T("f(1)"), T("f(2)"), T("f(3)")
    book.update("P", [x], [], 0)
    book.update("P", [y], [], 1)
    book.update("P", [z], [], 2)
    book.update("P", [y], [], 3)  # y: 2
    assert calls(book.retrieve("P")) == ["f(2)", "f(1)", "f(3)"]
    book.update("P", [z], [y], 4)  # y back to 1, z: 2
    # y was ranked ahead of x last time and keeps that place among the ties (insertion order: x, y)
    assert calls(book.retrieve("P")) == ["f(3)", "f(2)", "f(1)"]


def test_recent_tie_break_prefers_last_seen():
    book = _tie_scenario("recent")
    assert calls(book.retrieve("P", 2)) == ["f(4)", "f(3)"]  # w seen at 2, z last incremented at 1
    assert [e.call for e in book.entries("P")] == ["f(1)", "f(2)", "f(3)", "f(4)"]  # stored order untouched


def test_official_retrieval_order_survives_a_round_trip():
    book = _tie_scenario("official")
    again = MistakeBook.from_dict(json.loads(json.dumps(book.to_dict())), tie_break="official")
    assert calls(again.retrieve("P", 2)) == ["f(3)", "f(1)"]


# --------------------------------------------------------------------------------------------------
# Cap
# --------------------------------------------------------------------------------------------------


def test_cap_evicts_lowest_frequency_then_oldest():
    book = MistakeBook(max_per_problem=3)
    a, b, c, d, e = (T(f"f({i})") for i in range(5))
    book.update("P", [a, a, a, b], [], 0)
    book.update("P", [c], [], 1)
    counts = book.update("P", [d, e], [], 2)  # 5 entries: evict b (freq 1, last seen 0), then c (1, last 1)
    assert counts["evicted"] == 2 and counts["size"] == 3
    assert freqs(book, "P") == {"f(0)": 3, "f(3)": 1, "f(4)": 1}
    counts = book.update("P", [T("f(5)"), T("f(6)")], [], 2)  # all ties at 1, same iteration: earliest out
    assert counts["evicted"] == 2
    assert [x.call for x in book.entries("P")] == ["f(0)", "f(5)", "f(6)"]


def test_cap_age_is_last_seen_not_first_seen():
    book = MistakeBook(max_per_problem=2)
    a, b, c = T("f(1)"), T("f(2)"), T("f(3)")
    book.update("P", [a], [], 0)
    book.update("P", [b], [], 1)
    book.update("P", [a], [], 3)  # a: 2, last seen 3
    book.update("P", [], [a], 4)  # a: 1 again (first seen 0, last seen 3); b: 1 (last seen 1)
    assert book.update("P", [c], [], 5)["evicted"] == 1
    assert [x.call for x in book.entries("P")] == ["f(1)", "f(3)"]  # b is the stalest


# --------------------------------------------------------------------------------------------------
# Identity of an entry
# --------------------------------------------------------------------------------------------------


def test_canonical_identity_of_call_and_value():
    book = MistakeBook(max_per_problem=0)
    book.update("P", [T("f( 1,[2 ,3] )", {"b", "a"}), T("f(1, [2, 3])", {"a", "b"})], [], 0)
    book.update("P", [T("f(1, [2, 3])", {"a": 1, "b": 2}), T("f(1,[2,3])", {"b": 2, "a": 1})], [], 0)
    book.update("P", [T('g("s")', 1), T("g('s')", 1.0), T("g('s')", True)], [], 0)
    assert [(e.call, e.frequency) for e in book.entries("P")] == [
        ("f(1, [2, 3])", 2),  # whitespace and set order do not matter
        ("f(1, [2, 3])", 2),  # dict insertion order does not matter
        ("g('s')", 1),  # 1, 1.0 and True encode differently: three tests
        ("g('s')", 1),
        ("g('s')", 1),
    ]
    assert canonical_call("  h( (1) ) ") == "h(1)"


def test_bad_inputs_raise_clear_errors():
    book = MistakeBook()
    with pytest.raises(ValueError, match="not a Python expression"):
        book.update("P", [T("f(1")], [], 0)
    with pytest.raises(ValueError, match="problem 'P', call 'f\\(1\\)': expected value cannot be stored"):
        book.update("P", [T("f(1)", object())], [], 0)
    with pytest.raises(ValueError, match="tie_break"):
        MistakeBook(tie_break="newest")  # type: ignore[arg-type]


def test_disabled_book_is_inert_and_config_is_honoured():
    off = MistakeBook.from_config(MistakeBookConfig(enabled=False))
    assert off.update("P", [T("f(1)")], [], 0)["added"] == 0 and off.retrieve("P") == []
    on = MistakeBook.from_config(MistakeBookConfig(top_k=1, tie_break="official", max_per_problem=2))
    on.update("P", [T("f(1)"), T("f(2)"), T("f(3)"), T("f(2)")], [], 0)
    assert calls(on.retrieve("P")) == ["f(2)"] and on.size("P") == 2


# --------------------------------------------------------------------------------------------------
# Serialization
# --------------------------------------------------------------------------------------------------


def test_round_trip_preserves_values_types_and_state():
    book = MistakeBook(max_per_problem=0)
    expected = [
        (1, "a"),
        {"x", "y"},
        {"k": [1.5, None]},
        b"\x00\xff",
        2**100,
        float("inf"),
        -0.0,
        frozenset({3}),
    ]
    book.update("P", [T(f"f({i})", v) for i, v in enumerate(expected)], [], 5)
    book.update("Q", [T("g()", "q"), T("g()", "q")], [], 6)
    text = json.dumps(book.to_dict(), sort_keys=True)
    data = json.loads(text)
    assert data["schema"] == SCHEMA and list(data["problems"]) == ["P", "Q"]
    again = MistakeBook.from_dict(data)
    got = [t.expected for t in again.retrieve("P", 100)]
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert math.copysign(1.0, got[6]) == -1.0
    assert json.dumps(again.to_dict(), sort_keys=True) == text
    assert freqs(again, "Q") == {"g()": 2}
    assert again.entries("Q")[0].last_seen == 6
    # a restored entry is recognised by a fresh failure (same identity)
    assert again.update("P", [T("f(1)", {"y", "x"})], [], 7)["incremented"] == 1


def test_from_dict_rejects_unknown_schema_and_malformed_rows():
    with pytest.raises(ValueError, match="unsupported schema 'codea1.mistake_book/2'"):
        MistakeBook.from_dict({"schema": "codea1.mistake_book/2", "problems": {}})
    with pytest.raises(ValueError, match="unsupported schema None"):
        MistakeBook.from_dict({"problems": {}})
    good = {
        "call": "f(1)",
        "expected": "Tg==",
        "frequency": 1,
        "first_seen": 0,
        "last_seen": 0,
    }  # b"N" = None
    assert MistakeBook.from_dict({"schema": SCHEMA, "problems": {"P": [good]}}).retrieve("P") == [
        T("f(1)", None)
    ]
    for bad, msg in [
        ({**good, "frequency": 0}, r"problems\['P'\]\[1\]\.frequency: must be >= 1"),
        ({**good, "frequency": "2"}, r"problems\['P'\]\[1\]\.frequency: expected int"),
        ({**good, "expected": "!!"}, r"problems\['P'\]\[1\]\.expected: cannot decode"),
        (
            {k: v for k, v in good.items() if k != "last_seen"},
            r"problems\['P'\]\[1\]: missing keys \['last_seen'\]",
        ),
        ({**good, "call": "f(2)"} | {"expected": "Tg=="}, None),
    ]:
        rows = [{**good, "call": "f(0)"}, bad]
        if msg is None:
            MistakeBook.from_dict({"schema": SCHEMA, "problems": {"P": rows}})
            continue
        with pytest.raises(ValueError, match=msg):
            MistakeBook.from_dict({"schema": SCHEMA, "problems": {"P": rows}})
    with pytest.raises(ValueError, match="duplicate entries"):
        MistakeBook.from_dict({"schema": SCHEMA, "problems": {"P": [good, dict(good, call="f( 1 )")]}})


# --------------------------------------------------------------------------------------------------
# Property: frequencies >= 1, cap holds, and without a cap the book equals a plain counter model
# --------------------------------------------------------------------------------------------------

POOL = [T(f"f({i})", i % 3) for i in range(6)]
_step = st.tuples(
    st.sampled_from(["P", "Q"]),
    st.lists(st.sampled_from(POOL), max_size=8),
    st.lists(st.sampled_from(POOL), max_size=8),
)


class _ModelBook:
    """An independent list-based model of §8 (unbounded): stored order, frequencies, recency."""

    def __init__(self, tie_break: str) -> None:
        self.tie_break = tie_break
        self.rows: dict[str, list[list]] = {"P": [], "Q": []}  # [call, freq, first_seen, last_seen]

    def retrieve(self, pid: str, k: int) -> list[str]:
        rows = self.rows[pid]
        if self.tie_break == "official":
            rows.sort(key=lambda r: -r[1])
            ranked = rows
        else:
            ranked = sorted(rows, key=lambda r: (-r[1], -r[3], -r[2]))
        return [r[0] for r in ranked[:k]]

    def update(self, pid: str, failed: list[TestCase], passed: list[TestCase], it: int) -> None:
        rows = self.rows[pid]
        for t in passed:
            for r in rows:
                if r[0] == t.call:
                    r[1] -= 1
            rows[:] = [r for r in rows if r[1] > 0]
        for t in failed:
            hit = [r for r in rows if r[0] == t.call]
            if hit:
                hit[0][1] += 1
                hit[0][3] = it
            else:
                rows.append([t.call, 1, it, it])


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(_step, max_size=12),
    cap=st.integers(0, 4),
    tie_break=st.sampled_from(["recent", "official"]),
)
def test_invariants_hold_for_any_update_sequence(steps, cap, tie_break):
    book = MistakeBook(top_k=3, tie_break=tie_break, max_per_problem=cap)
    model = _ModelBook(tie_break)
    for it, (pid, failed, passed) in enumerate(steps):
        replay = calls(book.retrieve(pid))
        assert len(replay) <= 3
        counts = book.update(pid, failed, passed, it)
        entries = book.entries(pid)
        assert all(e.frequency >= 1 for e in entries)
        assert counts["size"] == len(entries)
        if cap:
            assert len(entries) <= cap
            assert counts["evicted"] >= 0
        else:  # without a cap the book must match the model exactly, retrieval order included
            assert replay == model.retrieve(pid, 3)
            model.update(pid, failed, passed, it)
            assert [(e.call, e.frequency) for e in entries] == [(r[0], r[1]) for r in model.rows[pid]]


def test_a_replayed_call_never_binds_a_name_of_the_program():
    """A stored call is held to the replay rule (``validity.replay_reason``) on update and on load: the
    book does not keep the entry point, so other names may be read, but nothing may bind or reach a
    namespace (bug guarded: a book file could carry ``f((f := ...))`` into every later step)."""
    book = MistakeBook()
    with pytest.raises(ValueError, match=r"refused \(walrus\)"):
        book.update("p", [TestCase("f((f := len) and 1)", 1)], [], 1)
    assert book.size() == 0
    good = MistakeBook()
    good.update("p", [TestCase("f(1)", 2)], [], 1)
    saved = good.to_dict()
    for call, code in [
        ("f((g := 1))", "walrus"),
        ("f(().__class__)", "dunder"),
        ("f((x for x in [1]).gi_frame)", "attribute"),
        ("f((lambda d=1: d)())", "binding"),
    ]:
        rows = [{**saved["problems"]["p"][0], "call": call}]
        with pytest.raises(ValueError, match=rf"problems\['p'\]\[0\]\.call: .*refused \({code}\)"):
            MistakeBook.from_dict({**saved, "problems": {"p": rows}})
    official = MistakeBook()
    official.update("p", [TestCase("len(f(1))", 1), TestCase("obj.f(2)", 1)], [], 1)  # official-mode tests
    assert official.size("p") == 2
