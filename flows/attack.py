"""Adversarial tests for a user's function: ``codea1 attack FILE.py::function [--spec TEXT]``.

What it does: the Test LLM reads the whole file (white-box, the §4.2 prompt with the function as the
"Buggy Code") and writes assert-style tests; every test's call and predicted answer run in the sandbox
against the user's file; the report lists the tests whose predicted answer disagrees with the function's
actual output (candidate bugs, or wrong predictions: a human judges) and the calls that raised.

The plan and the classification are the core's (:mod:`codea1_core.evaluation.attack`); this file
generates, runs (``tasks.execute.run_jobs``) and prints.

What it does not: decide who is right. Without a specification (``--spec``) the function's docstring
is the problem description; a better spec gives better predicted answers.

How to run: ``python -m flows.attack path/to/file.py::my_function [--spec "..."] [--suites 2]``.
Exit 2 with one line on a missing file or function.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from codea1_core.evaluation.attack import AttackReport
from codea1_core.types import Problem
from flows.common import UserError, load_stage_config, run_user_errors
from flows.solve import MODEL_HELP, registry_aware


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
    from codea1_core.evaluation.attack import plan_attack
    from codea1_core.method.prompts import test_messages
    from codea1_core.models.sampling import sampling_params
    from tasks.execute import run_jobs

    prompt = test_messages(problem, problem.reference_solution, cfg.reward.k)
    sampling = sampling_params(cfg, "eval", "test", cfg.seed + 1)
    texts = [c.text for c in test_policy.generate([prompt], suites, sampling)[0]]
    plan = plan_attack(problem, texts, cfg.tests.parse_mode)
    # any infra failure aborts (limit 0): a report missing some tests would look like a clean function
    label = f"attack on {problem.entry_point}"
    outcomes = run_jobs(executor, plan.jobs(), 0.0, label, limit_key="attack's limit")
    return plan.report(outcomes, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)


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
    parser.add_argument("--test-model", default=None, help=MODEL_HELP.format(role="test"))
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)

    def go() -> None:
        from flows.evaluate import evaluated_policy
        from sandbox import make_executor

        problem = load_target(args.target, args.spec)
        cfg = load_stage_config(args.params, list(args.overrides))
        policy = evaluated_policy(cfg, "test", registry_aware(cfg, "test", args.test_model))
        with make_executor(cfg.sandbox) as executor:
            report = attack(problem, policy, cfg, executor, args.suites)
        note = toy_model_note(cfg, problem.entry_point, args.test_model)
        print(format_report(replace(report, note=note)))

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
