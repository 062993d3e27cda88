"""Parsing of model responses: code extraction (docs/method.md §5.1) and assert extraction (§5.2, D5).

What it does: :func:`extract_code` pulls the candidate program out of a Code-LLM response;
:func:`extract_tests` turns a Test-LLM response into a :class:`~codea1_core.types.ParsedSuite` of
normalized ``(call, answer)`` sources plus a counted list of rejected asserts; :func:`nonprintable_ratio`
is the np statistic of §5.2.

What it does not do: run anything. GT filling, deduplication and answer checking happen in
``codea1_core.method.outcomes`` (§6). Nothing here raises on model output: any text yields a result.

Modes (``tests.parse_mode``):
* ``strict`` (ours, D5): ``assert CALL == EXPR`` and ``assert EXPR == CALL`` where CALL is a direct
  call of the entry point (the left side wins when both are calls, §18.2); names bound by simple
  assignments earlier in the block are substituted on both sides; every other assert form is counted
  invalid with a reason code.
* ``official`` (§5.2): an assert whose test is a comparison with a call on the left is kept and
  re-emitted with ``==`` (operator discarded, quirk 4); only bare-name call arguments are substituted;
  other forms are silently dropped, except in case B (no ``python`` block), where they count invalid.

Expected values must be plain data (``tests.literal_answers``, ours, default on, in both modes): an answer
that is not a literal of the value codec (``codea1_core.types.literal_value``: numbers, strings, bytes,
containers, ``float('nan')``, ``set()``...) or that names the entry point counts invalid with reason
``expected_not_literal`` (the rule is :func:`codea1_core.method.validity.is_plain_literal`). Why: the
predicted answer is evaluated next to the reference (§6.2), so ``assert f(2) == f(2)``, ``y = f(2)`` ...
``== y`` or ``== sorted(f(2))`` always "predict" correctly — a tautology that earns full validity and that RL
finds. The official parser accepts any expression here; ``literal_answers: false`` restores that (and its
numbers).

Every call and answer must also pass the allow-list of :func:`codea1_core.method.validity.expression_reason`
(no binding inside the expression, no dunder, namespace or frame access, no name beyond the entry point and
safe builtins): an assert that does not counts invalid with the rule's code (``walrus``, ``binding``,
``dunder``, ...; ``answer_``-prefixed for the answer), in every mode, so no caller ever runs such an
expression — evaluation (``plan_suites``) runs no gate.

Every accepted test also gets the generated-test gate's reason code (``ParsedSuite.checks``, from
:func:`codea1_core.method.validity.suite_checks`: call and answer forms, duplicates): the gate
(``tasks.quality.gx_gate_tests``, D5) rejects the tests whose code is not ``ok`` and does not check them
again. Callers that do not gate (evaluation) ignore the codes.

Speed: the suites written for one problem repeat asserts, so a one-line assert read while no name is bound
is judged once per (line, entry point, settings) and its verdict memoised (:func:`clear_memo` empties it);
a block made only of such lines is not parsed whole (the lines' statements are the block's, see
:func:`_assert_lines`). Every other block is parsed statement by statement, with the same results.

How to run: ``tests/core/method/test_parsing.py`` (includes hypothesis property tests).
"""

from __future__ import annotations

import ast
import copy
import functools
import re
import string
import textwrap
import warnings
from typing import Literal, NamedTuple

from codea1_core.method.validity import OK, answer_reason, call_reason, is_plain_literal, suite_checks
from codea1_core.types import ParsedSuite, ParsedTest

ParseMode = Literal["strict", "official"]

_FENCE_RE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}
_MAX_NODES = 5_000  # strict substitution limit (a 2000-char call has far fewer nodes): larger is not built
_ASSERT_LINE = re.compile(r"\s*assert\b")  # "assert x", "assert(x)"; not prose like "assertion"
_NONPRINTABLE_RE = re.compile(f"[^{re.escape(string.printable)}]")
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)


# --------------------------------------------------------------------------------------------------
# Fenced blocks and code (§5.1)
# --------------------------------------------------------------------------------------------------


def silence_parse_warnings() -> None:
    """Keep warnings raised while *parsing generated text* off the console (called by the entry points).

    ``ast.parse`` of model output emits ``SyntaxWarning`` / ``DeprecationWarning`` (invalid escapes, ``is`` with
    a literal, ...) attributed to the pseudo-file ``<unknown>``: noise about the model's text, not about our
    code. Only that pseudo-module is silenced; warnings from real source files still show.
    """
    for category in (SyntaxWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module="<unknown>")


def _blocks(text: str) -> list[tuple[str, str]]:
    """All closed fenced blocks as (lower-cased first word of the info string, content)."""
    out = []
    for match in _FENCE_RE.finditer(text):
        info = match.group(1).strip().split()
        out.append((info[0].lower() if info else "", match.group(2)))
    return out


def _clean(code: str) -> str:
    """Remove common indentation and surrounding blank space (never changes valid top-level code)."""
    return textwrap.dedent(code).strip()


def extract_code(text: str) -> str:
    """The candidate program of a Code-LLM response (§5.1).

    Order: the first block tagged ``python`` (also ``py``/``python3``), else the first untagged
    fenced block, else the first fenced block of any tag, else the whole response. The result is
    dedented and stripped of leading/trailing whitespace (our reading of "newlines stripped").
    """
    blocks = _blocks(text)
    for wanted in (lambda tag: tag in _PYTHON_TAGS, lambda tag: tag == "", lambda tag: True):
        for tag, content in blocks:
            if wanted(tag):
                return _clean(content)
    return text.strip()


def nonprintable_ratio(text: str) -> float:
    """np (§5.2): share of characters not in ``string.printable`` (any non-ASCII counts); 0 for ''."""
    if not text:
        return 0.0
    return len(_NONPRINTABLE_RE.findall(text)) / len(text)


# --------------------------------------------------------------------------------------------------
# Chunking of a broken block (§5.2 case A, step 2)
# --------------------------------------------------------------------------------------------------


def _scan(line: str, depth: int, quote: str | None) -> tuple[int, str | None]:
    """Bracket depth and open string quote after ``line``; brackets in strings/comments are ignored."""
    i = 0
    while i < len(line):
        if quote:
            if line[i] == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        ch = line[i]
        if ch == "#":
            break
        if ch in "'\"":
            quote = ch * 3 if line.startswith(ch * 3, i) else ch
            i += len(quote)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        i += 1
    if quote and len(quote) == 1:  # a one-quote string cannot continue on the next line
        quote = None
    return depth, quote


def _chunks(source: str) -> list[str]:
    """Split into bracket-balanced chunks; a line starting with ``assert `` resets an unbalanced buffer."""
    chunks: list[str] = []
    buf: list[str] = []
    depth, quote = 0, None
    for line in source.splitlines():
        if buf and line.lstrip().startswith("assert ") and (depth > 0 or quote):
            chunks.append("\n".join(buf))
            buf, depth, quote = [], 0, None
        buf.append(line)
        depth, quote = _scan(line, depth, quote)
        if depth <= 0 and quote is None and not line.rstrip().endswith("\\"):
            chunks.append("\n".join(buf))
            buf, depth = [], 0
    if buf:
        chunks.append("\n".join(buf))
    return chunks


class _OneLine(NamedTuple):
    """A chunk of one line at column 0 that starts with ``assert``: judged through the memo while no name
    is bound (:func:`_line_verdict` parses it alone, as :func:`_chunk_items` does)."""

    text: str


def _chunk_items(chunk: str) -> list[ast.stmt | str]:
    """The statements of one chunk parsed alone, or its reason code (see :func:`_parse_items`)."""
    try:
        body = ast.parse(textwrap.dedent(chunk)).body
    except _PARSE_ERRORS:
        return ["syntax_error"] if _ASSERT_LINE.match(chunk) else []
    if chunk[:1].isspace():
        return ["not_top_level" if isinstance(stmt, ast.Assert) else stmt for stmt in body]
    return list(body)


def _parse_items(source: str) -> list[ast.stmt | str | _OneLine]:
    """Top-level statements of a dedented block in document order, with reason codes for unusable chunks.

    The whole block is parsed when it can be; otherwise each bracket-balanced chunk is
    parsed alone (§5.2 step 2). An unparseable chunk starting with ``assert`` yields
    ``"syntax_error"``; an indented chunk (the body of a loop or function whose header broke)
    holding an assert yields ``"not_top_level"`` — both only matter in strict mode. A chunk of one line
    starting with ``assert`` is left to the caller, unparsed (:class:`_OneLine`).
    """
    try:
        return list(ast.parse(source).body)
    except _PARSE_ERRORS:
        pass
    items: list[ast.stmt | str | _OneLine] = []
    for chunk in _chunks(source):
        if chunk.startswith("assert") and "\n" not in chunk:
            items.append(_OneLine(chunk))
        elif chunk.strip():
            items.extend(_chunk_items(chunk))
    return items


# --------------------------------------------------------------------------------------------------
# Substitution and classification
# --------------------------------------------------------------------------------------------------


class _Substitute(ast.NodeTransformer):
    """Replace loaded names bound in ``env`` by a copy of their recorded expression."""

    def __init__(self, env: dict[str, ast.expr], shadowed: set[str]):
        self.env, self.shadowed = env, shadowed

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.env and node.id not in self.shadowed:
            return copy.deepcopy(self.env[node.id])
        return node


def _bound_inside(node: ast.AST) -> set[str]:
    """Names bound inside an expression (comprehension targets, lambda parameters, walrus)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            names.update(n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name))
        elif isinstance(sub, ast.Lambda):
            a = sub.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    names.add(arg.arg)
        elif isinstance(sub, ast.NamedExpr):
            names.add(sub.target.id)
    return names


def _substitute(node: ast.expr, env: dict[str, ast.expr]) -> ast.expr:
    if not env or not any(isinstance(sub, ast.Name) and sub.id in env for sub in ast.walk(node)):
        return node  # nothing to replace: skip the (slow) deep copy
    return _Substitute(env, _bound_inside(node)).visit(copy.deepcopy(node))


def _substitute_call_args(call: ast.Call, env: dict[str, ast.expr]) -> ast.Call:
    """Official substitution: only arguments and keyword values that are bare names (§5.2 step 3)."""
    args = [a.value if isinstance(a, ast.Starred) else a for a in call.args] + [
        kw.value for kw in call.keywords
    ]
    if not any(isinstance(a, ast.Name) and a.id in env for a in args):
        return call
    call = copy.deepcopy(call)

    def sub(arg: ast.expr) -> ast.expr:
        return copy.deepcopy(env[arg.id]) if isinstance(arg, ast.Name) and arg.id in env else arg

    call.args = [
        ast.Starred(sub(a.value), a.ctx) if isinstance(a, ast.Starred) else sub(a) for a in call.args
    ]
    for kw in call.keywords:
        kw.value = sub(kw.value)
    return call


def _is_entry_call(node: ast.expr, entry_point: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point


def _contains_entry_call(node: ast.expr, entry_point: str) -> bool:
    return any(_is_entry_call(sub, entry_point) for sub in ast.walk(node) if isinstance(sub, ast.expr))


def _classify_strict(test: ast.expr, entry_point: str) -> tuple[ast.expr, ast.expr] | str:
    """(call, answer) of a strict-mode assert test, or the reason code why it is invalid (D5)."""
    if not isinstance(test, ast.Compare):
        return "not_comparison"
    if len(test.ops) != 1:
        return "chained_comparison"
    if not isinstance(test.ops[0], ast.Eq):
        return "not_equality"
    left, right = test.left, test.comparators[0]
    if _is_entry_call(left, entry_point):  # both calls: the left side is the tested call (§18.2)
        return left, right
    if _is_entry_call(right, entry_point):
        return right, left
    if _contains_entry_call(left, entry_point) or _contains_entry_call(right, entry_point):
        return "wrapped_call"
    if isinstance(left, ast.Call) or isinstance(right, ast.Call):
        return "wrong_function"
    return "no_call"


def _classify_official(test: ast.expr) -> tuple[ast.expr, ast.expr] | str:
    """(call, first comparator) when the left operand is a call; the operator is discarded (quirk 4)."""
    if isinstance(test, ast.Compare) and isinstance(test.left, ast.Call):
        return test.left, test.comparators[0]
    return "not_call_comparison"


def _unparse(node: ast.expr) -> str | None:
    """The source of an expression node (``ast.unparse`` reads no source location of an expression, so
    nodes built by the substitution need none)."""
    try:
        return ast.unparse(node)
    except _PARSE_ERRORS:
        return None


def _assignment(stmt: ast.stmt, mode: ParseMode) -> tuple[str, ast.expr] | None:
    """``name = expr`` (and, in strict mode, ``name: T = expr``) as (name, expr); else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if (
        mode == "strict"
        and isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and stmt.value
    ):
        return stmt.target.id, stmt.value
    return None


def _expanded_size(node: ast.AST, sizes: dict[str, int]) -> int:
    """Node count of ``node`` after substituting the bound names (an upper bound; guards blow-ups)."""
    return sum(
        sizes.get(sub.id, 1) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) else 1
        for sub in ast.walk(node)
    )


# --------------------------------------------------------------------------------------------------
# Public entry point (§5.2)
# --------------------------------------------------------------------------------------------------


class _Settings(NamedTuple):
    """What a verdict depends on beside the assert itself: the entry point and the parse settings."""

    entry_point: str
    mode: ParseMode
    max_call: int
    max_answer: int
    literal: bool


_Verdict = ParsedTest | str | None
"""An assert's verdict: the accepted test, the reason code it counts invalid, or None (dropped silently)."""


def _judge(
    s: _Settings, stmt: ast.Assert, env: dict[str, ast.expr], sizes: dict[str, int], count_drops: bool
) -> _Verdict:
    """The verdict of one assert under the names bound so far (``env``, their node counts ``sizes``)."""
    if s.mode == "strict":
        if sizes and _expanded_size(stmt.test, sizes) > _MAX_NODES:
            return "too_long"
        got = _classify_strict(_substitute(stmt.test, env), s.entry_point)
    else:
        got = _classify_official(stmt.test)
        if not isinstance(got, str):
            got = (_substitute_call_args(got[0], env), got[1])  # type: ignore[arg-type]
    if isinstance(got, str):
        return got if count_drops else None
    call, answer = _unparse(got[0]), _unparse(got[1])
    if call is None or answer is None:
        return "syntax_error"
    if s.max_call and len(call) > s.max_call:
        return "call_too_long"
    if s.max_answer and len(answer) > s.max_answer:
        return "answer_too_long"
    if s.literal and not is_plain_literal(answer, s.entry_point):
        return "expected_not_literal"  # counted in every mode (module docstring)
    code = call_reason(call, s.entry_point, any_function=s.mode == "official")
    if code == OK:
        code = answer_reason(answer, s.entry_point, literal=False, plain=s.literal)
    return ParsedTest(call=call, answer=answer) if code == OK else code


_NOT_ONE_ASSERT = "<not one assert>"  # no reason code has angle brackets
""":func:`_line_verdict` of a line that parses to something else than exactly one ``assert`` statement."""
_UNPARSEABLE = "<unparseable>"
""":func:`_line_verdict` of a line that does not parse."""
_MEMO_LINE_CHARS = 400
"""Longest line :func:`_line_verdict` memoises (longer ones are judged each time: the memo stays small)."""


# A problem's M x N suites repeat lines, and a step parses problem by problem: a small memo holds them.
@functools.lru_cache(maxsize=1 << 14)
def _line_verdict(line: str, s: _Settings, count_drops: bool) -> _Verdict:
    """The verdict of one line that holds a whole assert and nothing else, with no name bound before it;
    :data:`_UNPARSEABLE` or :data:`_NOT_ONE_ASSERT` when it is not one."""
    try:
        body = ast.parse(line).body
    except _PARSE_ERRORS:
        return _UNPARSEABLE
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return _NOT_ONE_ASSERT
    return _judge(s, body[0], {}, {}, count_drops)


def clear_memo() -> None:
    """Forget the memoised verdicts (of assert lines and of calls, :func:`~codea1_core.method.validity.call_reason`):
    a benchmark's run starts with none, as a new training run does."""
    _line_verdict.cache_clear()
    call_reason.cache_clear()


def _judge_line(line: str, s: _Settings, count_drops: bool) -> _Verdict:
    if len(line) > _MEMO_LINE_CHARS:
        return _line_verdict.__wrapped__(line, s, count_drops)
    return _line_verdict(line, s, count_drops)


def _assert_lines(source: str) -> list[str] | None:
    """The lines of a dedented block when it holds only one-line asserts at column 0, blank lines and
    comments, else None.

    Such a block parses to the statements of its assert lines, each parsed alone: every assert line starts a
    statement at depth 0, and when it parses alone to one assert (checked by :func:`_line_verdict`) its
    tokens end on it with no open bracket, string or line continuation, so the tokens of the block are those
    of its lines one after another (blank lines and comments yield none). Refused here: a carriage return
    (it ends a line where ``split`` does not), NUL and a comment that UTF-8 cannot encode (a lone surrogate:
    the whole block's parse fails on them) and a line ending in a backslash (a continuation).
    """
    if "\r" in source or "\0" in source:
        return None
    lines = []
    for line in source.split("\n"):
        if line.startswith("assert"):
            if line.endswith("\\"):
                return None
            lines.append(line)
        elif line.lstrip(" \t").startswith("#"):
            if not line.isascii():
                try:
                    line.encode()
                except UnicodeEncodeError:
                    return None
        elif line.strip(" \t"):
            return None
    return lines


class _Collector:
    """Accumulates accepted tests and counted rejections of one response."""

    def __init__(
        self, entry_point: str, mode: ParseMode, max_call_chars: int, max_answer_chars: int, literal: bool
    ):
        self.settings = _Settings(entry_point, mode, max_call_chars, max_answer_chars, literal)
        self.entry_point, self.mode = entry_point, mode
        self.tests: list[ParsedTest] = []
        self.reasons: list[str] = []
        self.env: dict[str, ast.expr] = {}  # case A: names bound by simple assignments so far
        self.sizes: dict[str, int] = {}  # strict: node count of each resolved binding

    def bind(self, stmt: ast.stmt) -> None:
        """Record a simple assignment. Strict mode resolves earlier bindings now (``a = 1; b = a + 1``);
        a binding that would grow beyond ``_MAX_NODES`` (``b = a + a`` chains) is not built, and asserts
        using it count invalid (``too_long``)."""
        got = _assignment(stmt, self.mode)
        if got is None or got[0] == self.entry_point:  # never rebind the function under test
            return
        name, value = got
        if self.mode == "official":  # official: recorded as written, only used for bare call arguments
            self.env[name] = value
            return
        size = _expanded_size(value, self.sizes)
        if size > _MAX_NODES:  # poisoned: later bindings and asserts using it are oversized too
            self.env.pop(name, None)
            self.sizes[name] = _MAX_NODES + 1
            return
        self.env[name], self.sizes[name] = _substitute(value, self.env), size

    def record(self, verdict: _Verdict) -> None:
        if isinstance(verdict, ParsedTest):
            self.tests.append(verdict)
        elif verdict is not None:
            self.reasons.append(verdict)

    def add_block(self, source: str) -> None:
        """Case A: statements of one python block, with the assignment environment (§5.2).

        A one-line assert read while no name is bound is judged through the memo: a whole block of them
        (:func:`_assert_lines`: the same statements as the block's parse) or a chunk of a broken block."""
        strict, settings = self.mode == "strict", self.settings
        # A block whose first line starts with text has no margin: dedenting it only empties its blank
        # lines, which _assert_lines reads as blank either way.
        dedented = source[:1] in ("", " ", "\t", "\n")
        if dedented:
            source = textwrap.dedent(source)
        lines = None if self.env or self.sizes else _assert_lines(source)
        if lines is not None:
            verdicts = [_judge_line(line, settings, strict) for line in lines]
            if _NOT_ONE_ASSERT not in verdicts and _UNPARSEABLE not in verdicts:
                for verdict in verdicts:
                    self.record(verdict)
                return
        for item in _parse_items(source if dedented else textwrap.dedent(source)):
            if isinstance(item, _OneLine) and not (self.env or self.sizes):
                verdict = _judge_line(item.text, settings, strict)  # parsed alone, as _chunk_items does
                if verdict == _UNPARSEABLE:
                    self.add_statements(["syntax_error"] if _ASSERT_LINE.match(item.text) else [])
                elif verdict == _NOT_ONE_ASSERT:
                    self.add_statements(_chunk_items(item.text))
                else:
                    self.record(verdict)
            elif isinstance(item, _OneLine):
                self.add_statements(_chunk_items(item.text))
            else:
                self.add_statements([item])

    def add_statements(self, items: list[ast.stmt | str]) -> None:
        """Statements (and chunks' reason codes) of a block, in order."""
        strict = self.mode == "strict"
        for stmt in items:
            if isinstance(stmt, str):
                if strict:
                    self.reasons.append(stmt)
            elif isinstance(stmt, ast.Assert):
                self.record(_judge(self.settings, stmt, self.env, self.sizes, strict))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self.bind(stmt)
            elif strict:  # asserts nested in loops, functions, ... cannot be used as single tests
                nested = sum(isinstance(sub, ast.Assert) for sub in ast.walk(stmt))
                self.reasons.extend("not_top_level" for _ in range(nested))

    def add_lines(self, text: str) -> None:
        """Case B: every line starting with ``assert``, no environment; bad forms count invalid."""
        for line in text.splitlines():
            if _ASSERT_LINE.match(line):
                verdict = _judge_line(line.strip(), self.settings, True)
                self.record("syntax_error" if verdict in (_NOT_ONE_ASSERT, _UNPARSEABLE) else verdict)


def extract_tests(
    text: str,
    entry_point: str,
    mode: ParseMode = "strict",
    *,
    max_call_chars: int = 0,
    max_answer_chars: int = 0,
    literal_answers: bool = True,
) -> ParsedSuite:
    """Parse a Test-LLM response into normalized (call, answer) pairs (§5.2, D5).

    Args:
        text: the raw response.
        entry_point: name of the function under test.
        mode: ``"strict"`` (D5, default) or ``"official"`` (§5.2 behaviour).
        max_call_chars: longer call sources count invalid (``call_too_long``); 0 = no limit.
        max_answer_chars: longer answer sources count invalid (``answer_too_long``); 0 = no limit.
        literal_answers: answers that are not plain data count invalid (``expected_not_literal``).

    Returns:
        The accepted tests in document order with the gate's reason code of each, the invalid count with one
        reason code each, and np.
    """
    if mode not in ("strict", "official"):
        raise ValueError(f"tests.parse_mode must be 'strict' or 'official', got {mode!r}")
    collector = _Collector(entry_point, mode, max_call_chars, max_answer_chars, literal_answers)
    python_blocks = [content for tag, content in _blocks(text) if tag in _PYTHON_TAGS]
    if python_blocks:  # case A: blocks share one environment, as if joined with newlines
        for block in python_blocks:
            collector.add_block(block)
    else:  # case B
        collector.add_lines(text)
    tests = tuple(collector.tests)
    checks = suite_checks(
        tests,
        entry_point,
        any_function=mode == "official",
        literal=literal_answers,
        plain_answers=literal_answers,
    )  # literal_answers: every kept answer passed is_plain_literal above
    return ParsedSuite(
        tests=tests,
        invalid=len(collector.reasons),
        reasons=tuple(collector.reasons),
        nonprintable=nonprintable_ratio(text),
        checks=checks,
    )
