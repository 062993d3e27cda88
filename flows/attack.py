"""Adversarial tests for a user's function: ``codea1 attack FILE.py::function [--spec TEXT]``.

What it does: the Test LLM reads the whole file (white-box, the §4.2 prompt with the function as the
"Buggy Code") and writes assert-style tests; every test's call and predicted answer run in the sandbox
against the user's file; the report lists the tests whose predicted answer disagrees with the function's
actual output (candidate bugs, or wrong predictions: a human judges) and the calls that raised.

What it does not: decide who is right. Without a specification (``--spec``) the function's docstring
is the problem description; a better spec gives better predicted answers.

How to run: ``python -m flows.attack path/to/file.py::my_function [--spec "..."] [--suites 2]``.
Exit 2 with one line on a missing file or function.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from codea1_core.types import Problem
from flows.common import UserError, load_stage_config, run_user_errors


@dataclass(frozen=True)
class Finding:
    """One generated test and what happened when it ran."""

    call: str
    predicted: str
    actual: str = ""
    """``repr`` of the function's output (disagreements) or the error text (errors)."""
    support: int = 1
    """How many of the sampled suites wrote this same test (call and answer): agreement across suites."""


@dataclass(frozen=True)
class AttackReport:
    """Outcome of an attack: tests that agreed, disagreed, raised, or had an unevaluable answer."""

    target: str
    tests: int
    agreed: tuple[Finding, ...]
    disagreements: tuple[Finding, ...]
    errors: tuple[Finding, ...]
    invalid: tuple[Finding, ...]
    unparsed: int = 0
    """Asserts the parser rejected (not of the form ``assert f(...) == answer``)."""
    suites: int = 1
    note: str = ""
    """A caveat printed first (the built-in lab toy model on a function outside its training)."""


def load_target(target: str, spec: str | None = None) -> Problem:
    """``FILE.py::function`` -> a Problem whose reference is the file; UserError on any mistake."""
    if "::" not in target:
        raise UserError(f"{target}: expected FILE.py::function")
    file_part, _, func = target.rpartition("::")
    path = Path(file_part)
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid Python ({exc.msg})") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == func]
    if not fns:
        raise UserError(f"{path}: no top-level function named {func!r}")
    doc = ast.get_docstring(fns[-1]) or ""
    description = spec or doc or f"The function {func} as implemented in the code."
    return Problem(
        id=f"attack/{func}",
        source="user",
        split="test",
        prompt=description,
        description=description,
        entry_point=func,
        reference_solution=source,
    )


def attack(problem: Problem, test_policy: Any, cfg: Config, executor: Any, suites: int = 1) -> AttackReport:
    """Generate ``suites`` test suites against the function and classify every distinct test."""
    from codea1_core.evaluation.verdicts import reference_exprs
    from codea1_core.method.parsing import extract_tests
    from codea1_core.method.prompts import test_messages
    from codea1_core.values import values_equal
    from tasks.evaluate import eval_sampling

    prompt = test_messages(problem, problem.reference_solution, cfg.reward.k)
    texts = [c.text for c in test_policy.generate([prompt], suites, eval_sampling(cfg, 1))[0]]
    tests, support, unparsed = {}, {}, 0
    for text in texts:
        parsed = extract_tests(text, problem.entry_point, cfg.tests.parse_mode)
        unparsed += parsed.invalid
        for key in {(t.call, t.answer) for t in parsed.tests}:  # once per suite
            support[key] = support.get(key, 0) + 1
        for t in parsed.tests:
            tests.setdefault((t.call, t.answer), t)
    tests = list(tests.values())
    outcomes = executor.run_many([(problem.reference_solution, reference_exprs(tests))])[0] if tests else []
    agreed, wrong, errors, invalid = [], [], [], []
    for i, t in enumerate(tests):
        got, ans = outcomes[2 * i], outcomes[2 * i + 1]
        if got.status == "infra_error" or ans.status == "infra_error":
            raise RuntimeError(
                f"sandbox infrastructure error while running {t.call}: {got.error or ans.error}"
            )
        n = support[(t.call, t.answer)]
        if not got.ok:
            errors.append(Finding(t.call, t.answer, f"{got.status}: {got.error}".rstrip(": "), n))
        elif not ans.ok:
            invalid.append(Finding(t.call, t.answer, f"answer {ans.status}: {ans.error}".rstrip(": "), n))
        elif values_equal(got.value, ans.value, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol):
            agreed.append(Finding(t.call, t.answer, repr(got.value), n))
        else:
            wrong.append(Finding(t.call, t.answer, repr(got.value), n))
    return AttackReport(problem.entry_point, len(tests), tuple(agreed), _ranked(wrong), _ranked(errors),
                        tuple(invalid), unparsed, suites)  # fmt: skip


def _ranked(findings: list[Finding]) -> tuple[Finding, ...]:
    """Most-agreed first: a test several independent suites wrote is likelier a real bug than one suite's guess
    (stable: ties keep the generation order)."""
    return tuple(sorted(findings, key=lambda f: -f.support))


def toy_model_note(cfg: Config, entry_point: str, test_model: str | None) -> str:
    """The caveat for the built-in lab model on a function outside its training families, else ``""``.

    The default Test LLM (no ``--test-model``, ``data.train_sources: [lab]``) is the ~0.5M-parameter lab toy: it
    only ever saw the lab families, so on anything else its tests are close to noise.
    """
    from codea1_core.data.lab import training_family_names

    if test_model is not None or not set(cfg.data.train_sources) <= {"lab"}:
        return ""
    families = training_family_names(cfg.lab)
    if entry_point in families:
        return ""
    return (
        f"note: the Test LLM is the built-in lab toy (a tiny model trained only on the lab families: "
        f"{', '.join(families)}); {entry_point!r} is not one of them, so expect noise. "
        "Pass --test-model DIR (or train on your own data) for real findings."
    )


def format_report(report: AttackReport) -> str:
    """Human-readable report: disagreements first (candidate bugs), then errors."""
    lines = [report.note] if report.note else []
    lines.append(
        f"# attack on {report.target}: {report.tests} tests, {len(report.agreed)} agree with the function"
    )
    lines.append(
        f"\n# {len(report.disagreements)} disagreement(s): predicted answer != actual output"
        f" (most-agreed first: [suites that wrote the test / {report.suites}])"
    )
    lines += [
        f"[{f.support}/{report.suites}] {f.call}\n    predicted: {f.predicted}\n    actual:    {f.actual}"
        for f in report.disagreements
    ]
    lines.append(f"\n# {len(report.errors)} call(s) raised")
    lines += [f"[{f.support}/{report.suites}] {f.call}\n    {f.actual}" for f in report.errors]
    if report.invalid or report.unparsed:
        lines.append(
            f"\n# {len(report.invalid)} test(s) with an unevaluable answer, {report.unparsed} unparsed assert(s)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``codea1 attack FILE.py::function``; exit 2 with one line on user errors."""
    from codea1_core.method.parsing import silence_parse_warnings

    silence_parse_warnings()
    parser = argparse.ArgumentParser(
        prog="codea1 attack", description="Let the Test LLM write adversarial tests for your function."
    )
    parser.add_argument("target", help="FILE.py::function")
    parser.add_argument("--spec", default=None, help="what the function should do (default: its docstring)")
    parser.add_argument("--suites", type=int, default=1, help="test suites to sample (default 1)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--test-model", default=None)
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)

    def go() -> None:
        from flows.evaluate import load_policy
        from sandbox import make_executor

        problem = load_target(args.target, args.spec)
        cfg = load_stage_config(args.params, list(args.overrides))
        policy = load_policy(cfg, "test", args.test_model)
        executor = make_executor(cfg.sandbox)
        try:
            report = attack(problem, policy, cfg, executor, args.suites)
            note = toy_model_note(cfg, problem.entry_point, args.test_model)
            print(format_report(replace(report, note=note)))
        finally:
            if hasattr(executor, "close"):
                executor.close()

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
