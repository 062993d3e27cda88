"""Code and assert extraction (docs/method.md §5, D5): both parse modes, reason codes, and property tests."""

from __future__ import annotations

import ast
import string
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codea1_core.method import parsing
from codea1_core.method.parsing import extract_code, extract_tests, nonprintable_ratio
from codea1_core.types import ParsedSuite, ParsedTest


def block(*lines: str) -> str:
    return "Here are the tests:\n```python\n" + "\n".join(lines) + "\n```\nDone."


# --------------------------------------------------------------------------------------------------
# extract_code (§5.1)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, code",
    [
        (
            "x\n```python\ndef f():\n    return 1\n```\n```python\ndef g(): pass\n```",
            "def f():\n    return 1",
        ),
        ("```\nuntagged = 1\n```\n```python\ntagged = 2\n```", "tagged = 2"),
        ("```Python3 title\nx = 1\n```", "x = 1"),
        ("```\nuntagged = 1\n```", "untagged = 1"),
        ("```js\nlet a\n```\n```\nb = 2\n```", "b = 2"),
        ("```js\nlet a\n```", "let a"),
        ("\n\n  def f(): return 3  \n\n", "def f(): return 3"),
        ("```python\n    def f():\n        return 1\n```", "def f():\n    return 1"),  # dedented
        ("```python\ndef f():\n    return 1", "```python\ndef f():\n    return 1"),  # unclosed: whole text
    ],
)
def test_extract_code_order_of_preference(text, code):
    assert extract_code(text) == code


# --------------------------------------------------------------------------------------------------
# extract_tests, strict mode (D5)
# --------------------------------------------------------------------------------------------------


def calls_answers(suite):
    return [(t.call, t.answer) for t in suite.tests]


def test_strict_accepts_call_on_either_side_and_normalizes():
    suite = extract_tests(
        block("assert f( 1,2 )==3", "assert [1,  2] == f([2, 1])", "assert f(x=1) == f(2)"),
        "f",
        literal_answers=False,  # the official reading of a call answer; the default rejects it (below)
    )
    assert calls_answers(suite) == [("f(1, 2)", "3"), ("f([2, 1])", "[1, 2]"), ("f(x=1)", "f(2)")]
    assert suite.invalid == 0 and suite.reasons == ()


def test_strict_substitutes_assignments_on_both_sides_in_order():
    suite = extract_tests(
        block(
            "data = [3, 1]",
            "expected = sorted(data)",
            "assert f(data) == expected",
            "res = f(data + [0])",
            "assert res == [0, 1, 3]",
            "data = 'x'",
            "assert f(data) == 'x'",
            "assert f([data for data in range(2)]) == 1",  # comprehension variable is not substituted
        ),
        "f",
        literal_answers=False,
    )
    assert calls_answers(suite) == [
        ("f([3, 1])", "sorted([3, 1])"),
        ("f([3, 1] + [0])", "[0, 1, 3]"),
        ("f('x')", "'x'"),
        ("f([data for data in range(2)])", "1"),
    ]
    assert suite.invalid == 0


@pytest.mark.parametrize(
    "line, reason",
    [
        ("assert f(1) != 2", "not_equality"),
        ("assert f(1) < 2", "not_equality"),
        ("assert f(1) is None", "not_equality"),
        ("assert not f(0)", "not_comparison"),
        ("assert f(0)", "not_comparison"),
        ("assert isinstance(f(1), int)", "not_comparison"),
        ("assert 1 < f(1) == 2", "chained_comparison"),
        ("assert g(1) == 2", "wrong_function"),
        ("assert obj.f(1) == 2", "wrong_function"),
        ("assert sorted(f([2, 1])) == [1, 2]", "wrapped_call"),
        ("assert f(1)[0] == 2", "wrapped_call"),
        ("assert res == 5", "no_call"),
        ("assert f((1) == 2", "syntax_error"),
    ],
)
def test_strict_counts_every_other_form_invalid(line, reason):
    suite = extract_tests(block("assert f(0) == 0", line, "assert f(9) == 9"), "f")
    assert calls_answers(suite) == [("f(0)", "0"), ("f(9)", "9")]
    assert suite.invalid == 1 and suite.reasons == (reason,)


def test_strict_nested_asserts_are_not_top_level():
    suite = extract_tests(block("for x in range(3):", "    assert f(x) == x", "assert f(1) == 1"), "f")
    assert calls_answers(suite) == [("f(1)", "1")]
    assert suite.reasons == ("not_top_level",)


def test_broken_block_is_chunked_and_keeps_the_good_asserts():
    text = block(
        "assert f(1,",
        "assert f(2) == 2",
        "assert f([1,",
        "        2]) == 3  # comment with ( bracket",
        "s = ')('",
        "assert f(s) == 0",
        "for x in [1, 2:",
        "    assert f(x) == x",
    )
    strict = extract_tests(text, "f")
    assert calls_answers(strict) == [("f(2)", "2"), ("f([1, 2])", "3"), ("f(')(')", "0")]
    assert strict.reasons == ("syntax_error", "not_top_level")
    official = extract_tests(text, "f", mode="official")
    assert calls_answers(official) == calls_answers(strict)
    assert official.invalid == 0


def test_blocks_share_one_environment():
    text = "```python\nx = 4\n```\nand\n```python\nassert f(x) == 5\n```"
    assert calls_answers(extract_tests(text, "f")) == [("f(4)", "5")]


def test_length_limits_count_invalid():
    suite = extract_tests(
        block("assert f('" + "a" * 50 + "') == 1", "assert f(1) == 'bbbbbbbb'"),
        "f",
        max_call_chars=20,
        max_answer_chars=5,
    )
    assert suite.tests == ()
    assert suite.reasons == ("call_too_long", "answer_too_long")


# --------------------------------------------------------------------------------------------------
# official mode (§5.2) and case B
# --------------------------------------------------------------------------------------------------


def test_official_rewrites_operators_and_drops_silently():
    text = block(
        "expected = 99",
        "x = 3",
        "assert f(x) == expected",
        "assert f(1) != 2, 'msg'",
        "assert g(x) < 7",
        "res = f(5)",
        "assert res == 6",
        "assert 7 == f(6)",
        "assert not f(0)",
        "assert isinstance(f(1), int)",
    )
    suite = extract_tests(text, "f", mode="official", literal_answers=False)
    # call args that are bare names are substituted; the right-hand side is not; operators become ==
    assert calls_answers(suite) == [("f(3)", "expected"), ("f(1)", "2"), ("g(3)", "7")]
    assert suite.invalid == 0
    ours = extract_tests(text, "f", mode="official")  # tests.literal_answers (default): a name is no value
    assert calls_answers(ours) == [("f(1)", "2"), ("g(3)", "7")]
    assert ours.reasons == ("expected_not_literal",)


def test_case_b_counts_bad_lines_in_both_modes():
    text = "Tests:\nassert f(1) == 2\n  assert f(2) < 3\nassert ok\nassert f(\nnot an assert\n"
    official = extract_tests(text, "f", mode="official")
    assert calls_answers(official) == [("f(1)", "2"), ("f(2)", "3")]
    assert official.reasons == ("not_call_comparison", "syntax_error")
    strict = extract_tests(text, "f", mode="strict")
    assert calls_answers(strict) == [("f(1)", "2")]
    assert strict.reasons == ("not_equality", "not_comparison", "syntax_error")


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="parse_mode"):
        extract_tests("", "f", mode="lenient")


def test_nonprintable_ratio():
    assert nonprintable_ratio("") == 0.0
    assert nonprintable_ratio("abc\n") == 0.0
    assert nonprintable_ratio("ab\x00é") == 0.5
    assert extract_tests("assert f(1) == 'é'", "f").nonprintable == pytest.approx(1 / 18)


# --------------------------------------------------------------------------------------------------
# Properties (hypothesis)
# --------------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.binary(max_size=4),
)
literals = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=2),
    ),
    max_leaves=6,
)


def normalized(src: str) -> str:
    return ast.unparse(ast.parse(src, mode="eval").body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.lists(literals, max_size=3), literals), max_size=6),
    st.sampled_from(["strict", "official"]),
    st.booleans(),
)
def test_rendered_asserts_round_trip(cases, mode, answer_left):
    lines, expected = [], []
    for args, answer in cases:
        call = "f(" + ", ".join(repr(a) for a in args) + ")"
        if answer_left and mode == "strict":
            lines.append(f"assert {answer!r} == {call}")
        else:
            lines.append(f"assert {call} == {answer!r}")
        expected.append(ParsedTest(normalized(call), normalized(repr(answer))))
    suite = extract_tests(block(*lines), "f", mode=mode)
    assert list(suite.tests) == expected
    assert suite.invalid == 0


fragments = st.sampled_from(
    [
        "```python\n",
        "```\n",
        "```",
        "assert ",
        "f(",
        ")",
        "==",
        "!=",
        "x = ",
        "\n",
        "    ",
        "'",
        '"""',
        "#",
        "[",
        "]",
        "\\",
        "\x00",
        "é",
        "1",
        "for x in y:\n",
        "lambda: ",
        "not ",
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.text(), st.lists(fragments, max_size=40).map("".join)),
    st.sampled_from(["strict", "official"]),
)
def test_extractors_never_raise_and_np_is_a_fraction(text, mode):
    suite = extract_tests(text, "f", mode=mode)
    assert suite.invalid == len(suite.reasons)
    assert 0.0 <= suite.nonprintable <= 1.0
    for t in suite.tests:  # every accepted call/answer is a valid expression
        ast.parse(t.call, mode="eval")
        ast.parse(t.answer, mode="eval")
    assert isinstance(extract_code(text), str)
    assert 0.0 <= nonprintable_ratio(text) <= 1.0
    if set(text) <= set(string.printable):
        assert nonprintable_ratio(text) == 0.0


code_lines = st.lists(
    st.text(
        alphabet=st.characters(
            blacklist_characters="`\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", blacklist_categories=("Cs",)
        ),
        max_size=20,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(code_lines, st.sampled_from(["python", "py", "", "Python3"]), st.text(alphabet="ab \n", max_size=10))
def test_extract_code_returns_the_fenced_block(lines, tag, prose):
    code = "\n".join(lines)
    text = f"{prose}\n```{tag}\n{code}\n```\n{prose}"
    assert extract_code(text) == textwrap.dedent(code).strip()


def test_case_b_ignores_prose_that_merely_starts_with_assert():
    suite = extract_tests("Assertions follow.\nassertion-based tests:\nassert(f(1) == 2)\n", "f")
    assert calls_answers(suite) == [("f(1)", "2")] and suite.invalid == 0


def test_strict_substitution_cannot_blow_up():
    """Regression: ``b = a + a`` chains double per line; resolving them eagerly would need 2**40 nodes.
    Oversized bindings are not built; an assert using one counts invalid (``too_long``)."""
    lines = ["a0 = [1, 2, 3]"] + [f"a{i} = a{i - 1} + a{i - 1}" for i in range(1, 41)]
    suite = extract_tests(
        block(*lines, "assert f(a40) == 1", "assert f(a2) == 2", "a40 = 5", "assert f(a40) == 3"), "f"
    )
    assert suite.reasons == ("too_long",)
    assert suite.tests == (
        ParsedTest("f([1, 2, 3] + [1, 2, 3] + ([1, 2, 3] + [1, 2, 3]))", "2"),
        ParsedTest("f(5)", "3"),
    )


def test_parse_warnings_about_generated_text_stay_off_the_console() -> None:
    """Regression: parsing model output printed SyntaxWarnings to the console."""
    import subprocess
    import sys

    code = "import ast{}; ast.parse('x = \"\\\\d\"; y = x is 1')"
    quiet = "; from codea1_core.method.parsing import silence_parse_warnings; silence_parse_warnings()"
    run = [sys.executable, "-W", "default", "-c"]
    loud = subprocess.run([*run, code.format("")], capture_output=True, text=True, check=True)
    assert "invalid escape sequence" in loud.stderr  # the noise exists...
    silent = subprocess.run([*run, code.format(quiet)], capture_output=True, text=True, check=True)
    assert silent.stderr == ""  # ...and is silenced


# --------------------------------------------------------------------------------------------------
# The memoised line path against the statement-by-statement parse
# --------------------------------------------------------------------------------------------------


def statement_by_statement(text: str, entry_point: str, **kwargs) -> ParsedSuite:
    """``extract_tests`` without the line path or its memo: every block parsed whole (or chunk by chunk when
    it is broken) and every assert judged from its statement."""
    with pytest.MonkeyPatch.context() as mp:
        items = parsing._parse_items
        mp.setattr(parsing, "_assert_lines", lambda source: None)
        mp.setattr(
            parsing,
            "_parse_items",
            lambda source: [
                stmt
                for item in items(source)
                for stmt in (
                    parsing._chunk_items(item.text) if isinstance(item, parsing._OneLine) else [item]
                )
            ],
        )
        mp.setattr(parsing, "_judge_line", parsing._line_verdict.__wrapped__)
        return extract_tests(text, entry_point, **kwargs)


SETTINGS = [
    {"mode": "strict"},
    {"mode": "official"},
    {"mode": "strict", "literal_answers": False},
    {"mode": "official", "literal_answers": False},
    {"mode": "strict", "max_call_chars": 12, "max_answer_chars": 4},
]
line_parts = st.sampled_from(
    [
        "assert f(1) == 2",
        "assert f(1) == 2",  # a repeated line: a memo hit
        "assert 3 == f([1, 2])",
        "assert f(*[1], k=2) == {'a': (1,)}",
        "assert f(1) != 2",
        "assert f(1 == 2",
        "assert f(1) == 2; y = 3",
        "assert f(1) == 2  # why \\",
        "assert f(y) == y",
        "assert f(x := 1) == 1",
        "assert f(().__class__) == 1",
        "assert f(2) == f(2)",
        "assert g(1) == 2",
        "assert(f(4) == 5)",
        "assert f('\uff45') == '\uff4c'",
        "assertion = 1",
        "y = f(2)",
        "y: int = 4",
        "f = 3",
        "for i in range(3):",
        "    assert f(i) == i",
        "\tassert f(1) == 1",
        "# a comment",
        "   # an indented comment",
        "# \ud800",
        "# \x00",
        "# a carriage return\rassert f(9) == 1",
        "",
        "  \t",
        "\x0c",
        "\r",
        "\x00",
        "assert f('''a",
        "b''') == 1",
        "assert f(1) == \\",
        "  2",
        "assert f(1)==2",
        "assert f(float('nan')) == float('inf')",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(line_parts, max_size=8), min_size=1, max_size=3),
    st.sampled_from(["```python\n{}\n```", "```py\n    {}\n```", "{}", "Tests:\n{}\nDone."]),
    st.sampled_from(SETTINGS),
)
def test_memoised_line_path_equals_the_statement_by_statement_parse(blocks, frame, kwargs):
    """A block of one-line asserts is judged line by line through the memo, a broken block's one-line chunks
    too: every result (tests, reason codes, checks) equals the whole-block parse's, for any block."""
    text = "\n".join(frame.format("\n".join(lines)) for lines in blocks)
    assert extract_tests(text, "f", **kwargs) == statement_by_statement(text, "f", **kwargs)


def rendered_corpus(groups: list[tuple[list[str], str]]) -> list[tuple[str, str]]:
    """Responses made of real asserts: one block, the same lines without a fence (case B), an indented
    block, and blocks with a broken line, an assignment or a comment inserted."""
    out = []
    for i, (lines, ep) in enumerate(groups):
        extra = [f"assert {ep}(1 == 2", "x = 3", "# é", f"    assert {ep}(2) == 1", f"assert {ep}(1) == 2 \\"]
        changed = [*lines[: i % 4], extra[i % len(extra)], *lines[i % 4 :]]
        for body in ("\n".join(lines), "\n".join(changed)):
            out.append((f"```python\n{body}\n```", ep))
        out.append(("Tests:\n" + "\n".join(lines), ep))
        out.append(("```python\n    " + "\n    ".join(lines) + "\n```", ep))
    return out


def test_memoised_parse_equals_the_statement_by_statement_parse_on_the_lab_and_mbpp(shared_data_dir):
    """The same over real asserts: MBPP's (human-written), HumanEval+'s and MBPP+'s base tests and the lab's
    golden tests, rendered as responses (``rendered_corpus``)."""
    import builtins
    import json

    from codea1_core.config import LabConfig
    from codea1_core.data.datasets import load_evalplus
    from codea1_core.data.lab import lab_problems

    groups = []
    for row in map(json.loads, (shared_data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()):
        tree = ast.parse(row["test_list"][0])
        called = [
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        ]
        groups.append((row["test_list"], next((c for c in called if c not in vars(builtins)), "f")))
    answers = ("True", "[1.0, 2.5]", "'x'", "None", "-3")
    for folder, source in (("humanevalplus", "humanevalplus"), ("mbppplus", "mbppplus")):
        path = next((shared_data_dir / folder).glob("*.jsonl*"))
        for p in load_evalplus(path, source):
            calls = [t.call for t in (*p.tests[:10], *p.plus_tests[:10])]
            groups.append(([f"assert {c} == {answers[i % 5]}" for i, c in enumerate(calls)], p.entry_point))
    for p in lab_problems(LabConfig(), "train"):
        groups.append(([f"assert {t.call} == {t.expected!r}" for t in p.tests], p.entry_point))
    corpus = rendered_corpus(groups)
    assert len(corpus) > 5_000
    parsing.clear_memo()
    for text, ep in corpus:
        assert extract_tests(text, ep) == statement_by_statement(text, ep), text


def test_a_block_of_one_line_asserts_is_judged_line_by_line_through_the_memo(monkeypatch):
    """The line path: no statement of the block is parsed whole, and a line seen before is not parsed again."""
    monkeypatch.setattr(parsing, "_parse_items", lambda source: pytest.fail("parsed statement by statement"))
    parsing.clear_memo()
    text = block("assert f(1) == 2", "", "# the edge", "assert f(2) == 3")
    first = extract_tests(text, "f")
    assert calls_answers(first) == [("f(1)", "2"), ("f(2)", "3")]
    assert extract_tests(text, "f") == first
    info = parsing._line_verdict.cache_info()
    assert (info.misses, info.hits) == (2, 2)
