"""Plain data types shared by every layer: problems, tests, execution outcomes, outcome matrices.

Pure dataclasses, no behaviour beyond (de)serialisation helpers. The sandbox produces
:class:`CallOutcome`; rewards and the Mistake Book are pure functions of an :class:`OutcomeMatrix`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

CallStatus = Literal["ok", "error", "timeout", "memory", "unsupported_output", "program_error", "infra_error"]
CALL_STATUSES: tuple[str, ...] = (
    "ok",
    "error",
    "timeout",
    "memory",
    "unsupported_output",
    "program_error",
    "infra_error",
)


@dataclass(frozen=True)
class CallOutcome:
    """What one call of a program did, as observed by the trusted parent.

    ``value`` is the decoded plain value when ``status == "ok"`` (else None); ``error`` is
    ``"ExcType: message"`` for failures. ``infra_error`` means the executor failed, not the program:
    it is never scored (docs/method.md D4).
    """

    status: CallStatus
    value: Any = None
    error: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """The call ran and returned a value (status ``ok``)."""
        return self.status == "ok"


@dataclass(frozen=True)
class TestCase:
    """One golden or generated test: a call of the entry point and its expected value.

    The expected value always comes from running the reference solution on ``call`` (D1).
    """

    __test__ = False  # not a pytest class

    call: str
    expected: Any


@dataclass(frozen=True)
class Problem:
    """A programming problem with a reference solution and golden tests."""

    id: str
    """Globally unique, e.g. ``HumanEval/0``, ``Mbpp/2``, ``mbpp/601``, ``lab/clamp/3``."""
    source: str
    """``humanevalplus``, ``mbppplus``, ``mbpp``, ``humaneval``, ``kodcode``, ``lab``, ..."""
    split: str
    """``train``, ``val`` or ``test``."""
    prompt: str
    """Code-role problem text (HumanEval: signature + docstring; MBPP: ``def`` line + docstring)."""
    description: str
    """Test-role problem description (``clean_description``)."""
    entry_point: str
    """Name of the function the tests call."""
    reference_solution: str
    """Complete, self-contained reference code (imports included)."""
    tests: tuple[TestCase, ...] = ()
    """Golden tests (calls with reference-computed expected values)."""
    imports: tuple[str, ...] = ()
    """Import lines the problem needs (also present in ``reference_solution``)."""
    atol: float = 0.0
    """Absolute float tolerance of the benchmark (EvalPlus ``atol``); 0 = the sandbox default."""
    plus_tests: tuple[TestCase, ...] = ()
    """EvalPlus ``plus_input`` tests (``tests`` holds the base inputs)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form extra data (family name, parameters, difficulty, ...)."""


# --------------------------------------------------------------------------------------------------
# Parsed test responses (docs/method.md §5.2, D5) — produced by ``codea1_core.method.parsing``
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedTest:
    """One accepted assert of a test response: the tested call and the model's predicted answer.

    Both are normalized Python expression sources (``ast.unparse``). The answer only decides
    validity; the expected value used for scoring always comes from the reference solution (D1).
    """

    __test__ = False  # not a pytest class

    call: str
    answer: str


@dataclass(frozen=True)
class ParsedSuite:
    """A parsed test response: its accepted tests in document order and what was rejected."""

    tests: tuple[ParsedTest, ...] = ()
    """Accepted (call, answer) pairs, in document order, not yet deduplicated (§6 does that)."""
    invalid: int = 0
    """Asserts the parser counted invalid (strict: every unusable assert form; official: case B only)."""
    reasons: tuple[str, ...] = ()
    """One snake_case reason code per invalid assert (``not_equality``, ``no_call``, ``syntax_error``, ...)."""
    nonprintable: float = 0.0
    """np: share of characters of the response outside ``string.printable`` (§5.2, §7.3)."""
    checks: tuple[str, ...] = ()
    """The generated-test gate's reason code of each accepted test (``ok``, ``dunder``, ``duplicate``, ...;
    D5), from ``codea1_core.method.validity.suite_checks``; the gate rejects the tests whose code is not
    ``ok``."""


# --------------------------------------------------------------------------------------------------
# Execution outcomes (docs/method.md §6, D1-D4) — assembled by ``codea1_core.method.outcomes``
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteOutcome:
    """What one test suite (m, n) amounted to after GT filling and running candidate m (§6.3)."""

    tests: tuple[TestCase, ...] = ()
    """The kept (valid) tests in document order, with expected values from the reference (D1)."""
    fails: tuple[bool, ...] = ()
    """g(m, n): one flag per kept test, True when candidate m failed it (error, timeout, or unequal)."""
    invalid: int = 0
    """I(m, n): parser-invalid asserts + GT errors + within-suite duplicates + wrong predicted answers."""
    reasons: tuple[str, ...] = ()
    """One reason code per invalid count (parser codes, ``gt_<status>``, ``duplicate``, ``wrong_answer``)."""
    nonprintable: float = 0.0
    """np of the test response."""

    @property
    def valid(self) -> int:
        """V(m, n): number of kept tests."""
        return len(self.tests)

    @property
    def n_failed(self) -> int:
        """Number of kept tests that candidate m failed."""
        return sum(self.fails)


_FLOAT_WORDS = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}


def literal_value(source: str) -> Any:
    """Evaluate a ``values.to_literal`` source without ``eval`` (for re-reading logged outcomes).

    Accepts what ``ast.literal_eval`` accepts plus ``float('nan'|'inf'|'-inf')``, ``set()`` and
    ``frozenset({...})``; anything else raises ``ValueError``.
    """

    def conv(node: ast.expr) -> Any:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            name, args = node.func.id, node.args
            if name == "float" and len(args) == 1 and isinstance(args[0], ast.Constant):
                if str(args[0].value).lower() in _FLOAT_WORDS:  # a str, or a float literal that overflowed
                    return float(cast("str | float", args[0].value))
            if name in ("set", "frozenset") and len(args) <= 1:
                items = conv(args[0]) if args else ()
                return set(items) if name == "set" else frozenset(items)
            raise ValueError(f"not a plain literal: {ast.unparse(node)[:80]}")
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [conv(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            return {conv(k): conv(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
        return ast.literal_eval(node)

    return conv(ast.parse(source, mode="eval").body)


@dataclass(frozen=True)
class OutcomeMatrix:
    """Everything the rewards and the Mistake Book update need for one problem (§6-§8).

    Indexing: ``m`` over the M candidate codes, ``n`` over the N suites written against each code.
    ``code_infra[m]`` / ``problem_infra`` mark infrastructure failures (D4): such codes are never
    scored. A code is valid (``code_valid[m]``) when its program was defined without
    ``program_error`` (§6.2 step 5); an infra-masked code is never valid.
    """

    problem_id: str
    code_valid: tuple[bool, ...]
    """valid(m) per code."""
    code_infra: tuple[bool, ...]
    """True when code m's candidate job hit an ``infra_error`` (masked, never scored)."""
    problem_infra: bool
    """True when the reference job failed (infra, or the reference itself broke): the whole problem is masked."""
    suites: tuple[tuple[SuiteOutcome, ...], ...]
    """[M][N] suite outcomes."""
    replay: tuple[TestCase, ...] = ()
    """Mistake-Book tests replayed against every code (the same list for all M codes, §8)."""
    replay_passed: tuple[tuple[bool, ...], ...] = ()
    """[M][H] pass flags of the replayed tests per code."""
    problem_error: str = ""
    """Why the problem is masked (empty when it is not)."""

    @property
    def n_codes(self) -> int:
        """M."""
        return len(self.code_valid)

    def failed_tests(self) -> list[TestCase]:
        """Every failing valid generated test over all valid codes and all suites, duplicates included (§8)."""
        if self.problem_infra:
            return []
        out: list[TestCase] = []
        for m, row in enumerate(self.suites):
            if not self.code_valid[m]:
                continue
            for suite in row:
                out.extend(t for t, failed in zip(suite.tests, suite.fails, strict=True) if failed)
        return out

    def passed_replay(self) -> list[TestCase]:
        """Every replayed test passed by a valid code, duplicates included (§8)."""
        if self.problem_infra:
            return []
        out: list[TestCase] = []
        for m, flags in enumerate(self.replay_passed):
            if self.code_valid[m]:
                out.extend(t for t, ok in zip(self.replay, flags, strict=True) if ok)
        return out

    def to_rows(self) -> list[dict[str, Any]]:
        """Flat rows for the per-iteration outcome parquet: one per suite (m, n), one per code's replay.

        Every row has the same keys. Replay rows (``kind == "replay"``, ``n == -1``) exist for every code,
        even without replayed tests, so each code appears. ``fails`` of a replay row are the failed flags.
        Expected values are Python literals (``values.to_literal``). :meth:`from_rows`
        rebuilds the matrix, so every reward can be re-derived offline.
        """
        from codea1_core.values import to_literal  # local: types stays importable on its own

        def row(
            kind: str, m: int, n: int, tests: tuple[TestCase, ...], fails: Any, **kw: Any
        ) -> dict[str, Any]:
            return {
                "problem_id": self.problem_id,
                "kind": kind,
                "m": m,
                "n": n,
                "code_valid": bool(self.code_valid[m]),
                "code_infra": bool(self.code_infra[m]),
                "problem_infra": bool(self.problem_infra),
                "problem_error": self.problem_error,
                "valid": len(tests),
                "fails": [bool(f) for f in fails],
                "calls": [t.call for t in tests],
                "expected": [to_literal(t.expected) for t in tests],
                **kw,
            }

        rows = []
        for m, suites in enumerate(self.suites):
            for n, s in enumerate(suites):
                rows.append(
                    row(
                        "suite",
                        m,
                        n,
                        s.tests,
                        s.fails,
                        invalid=s.invalid,
                        reasons=list(s.reasons),
                        nonprintable=float(s.nonprintable),
                    )
                )
            failed = [not p for p in self.replay_passed[m]]
            rows.append(row("replay", m, -1, self.replay, failed, invalid=0, reasons=[], nonprintable=0.0))
        return rows

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> OutcomeMatrix:
        """Rebuild one problem's matrix from its :meth:`to_rows` rows (the inverse, for offline re-scoring).

        Raises:
            ValueError: when the rows are empty, mix problems, or a field is missing or malformed.
        """
        if not rows:
            raise ValueError("OutcomeMatrix.from_rows: no rows")
        pid = rows[0].get("problem_id")
        try:
            codes = sorted({int(r["m"]) for r in rows})
            if codes != list(range(len(codes))) or any(r["problem_id"] != pid for r in rows):
                raise ValueError(
                    f"rows of problem {pid}: codes {codes} are not 0..M-1, or problem ids differ"
                )
            replay = {int(r["m"]): r for r in rows if r["kind"] == "replay"}

            def tests(r: Mapping[str, Any]) -> tuple[TestCase, ...]:
                return tuple(
                    TestCase(c, literal_value(e)) for c, e in zip(r["calls"], r["expected"], strict=True)
                )

            def suite(r: Mapping[str, Any]) -> SuiteOutcome:
                fails = tuple(bool(f) for f in r["fails"])
                return SuiteOutcome(
                    tests(r), fails, int(r["invalid"]), tuple(r["reasons"]), float(r["nonprintable"])
                )

            suites = tuple(
                tuple(
                    suite(r)
                    for r in sorted(
                        (r for r in rows if r["m"] == m and r["kind"] == "suite"), key=lambda r: r["n"]
                    )
                )
                for m in codes
            )
            return cls(
                problem_id=str(pid),
                code_valid=tuple(bool(replay[m]["code_valid"]) for m in codes),
                code_infra=tuple(bool(replay[m]["code_infra"]) for m in codes),
                problem_infra=bool(replay[0]["problem_infra"]),
                suites=suites,
                replay=tests(replay[0]),
                replay_passed=tuple(tuple(not f for f in replay[m]["fails"]) for m in codes),
                problem_error=str(replay[0]["problem_error"]),
            )
        except (KeyError, TypeError, SyntaxError) as exc:
            raise ValueError(f"rows of problem {pid}: missing or malformed field: {exc!r}") from None


@dataclass(frozen=True)
class GoldenOutcome:
    """Golden-test results of the M codes of one problem (the Golden-Tests baseline, §7.4, D10)."""

    problem_id: str
    tests: tuple[TestCase, ...]
    """The golden tests that were run (the problem's ``tests``)."""
    code_valid: tuple[bool, ...]
    """valid(m): the program was defined without ``program_error``."""
    code_infra: tuple[bool, ...]
    """True when code m's job hit an ``infra_error`` (masked, never scored)."""
    passed: tuple[tuple[bool, ...], ...]
    """[M][T] pass flags per code and golden test."""

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per code: validity, infra flag and pass flags."""
        return [
            {
                "problem_id": self.problem_id,
                "m": m,
                "code_valid": bool(self.code_valid[m]),
                "code_infra": bool(self.code_infra[m]),
                "passed": list(self.passed[m]),
                "n_tests": len(self.tests),
            }
            for m in range(len(self.code_valid))
        ]
