"""Test-time collaboration: the Code LLM proposes, the Test LLM's white-box tests pick (docs/method.md §15.6).

What it does: N candidate solutions from the Code LLM; for each distinct candidate one test suite from
the Test LLM written against that candidate (white-box, the §4.2 prompt); every distinct test call runs
on every candidate and every predicted answer is evaluated on its own, all in one sandbox batch. The
candidate passing the most valid tests (tests whose answer evaluates) wins; ties go to the candidate
whose outputs agree most with the other candidates', then to the earliest. The selection rule and its
plan are the core's (:mod:`codea1_core.evaluation.collaboration`), the runs ``tasks/collaboration.py``'s; this file is
the CLI: ``codea1 solve --problem FILE`` prints the chosen code, its tests and the vote.
(The ``solve_benchmark`` task of ``tasks/collaboration.py`` scores the chosen candidates of a benchmark for the
evaluate stage.)

Problem file formats (``--problem``):
  * ``.json`` / ``.yaml`` / ``.yml``: a mapping with ``entry_point`` (required), ``prompt`` (the
    code-role text: signature + docstring) and/or ``description`` (plain text; each defaults to the
    other), optional ``imports`` (list of import lines) and ``id``.
  * ``.py``: a stub such as ``def f(x):\\n    \"\"\"What f does.\"\"\"``; the entry point is the last
    top-level function (or ``--entry-point``), the prompt is the file, the description its docstring.

How to run: ``python -m flows.solve --problem problem.yaml [--n 8] [--code-model DIR] [--test-model DIR]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from codea1_core.evaluation.collaboration import SolveResult
from codea1_core.types import Problem
from flows.common import UserError, load_stage_config, run_user_errors

# --------------------------------------------------------------------------------------------------
# Problem files
# --------------------------------------------------------------------------------------------------


def _problem_from_py(path: Path, text: str, entry_point: str | None) -> Problem:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid Python ({exc.msg})") from None
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if entry_point:
        funcs = [f for f in funcs if f.name == entry_point]
    if not funcs:
        raise UserError(f"{path}: no top-level function{' ' + entry_point if entry_point else ''} found")
    fn = funcs[-1]
    imports = tuple(ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))
    doc = ast.get_docstring(fn) or ""
    return Problem(
        id=f"user/{fn.name}",
        source="user",
        split="test",
        prompt=text,
        description=doc or text,
        entry_point=fn.name,
        reference_solution="",
        imports=imports,
    )


def load_problem_file(path: str | Path, entry_point: str | None = None) -> Problem:
    """A :class:`Problem` (without reference) from a JSON, YAML or Python file; UserError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: problem file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    if path.suffix == ".py":
        return _problem_from_py(path, text, entry_point)
    if path.suffix not in (".json", ".yaml", ".yml"):
        raise UserError(f"{path}: unsupported problem file type {path.suffix!r} (use .json, .yaml or .py)")
    try:
        import yaml

        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with entry_point and prompt/description")
    ep = entry_point or data.get("entry_point")
    if not isinstance(ep, str) or not ep.isidentifier():
        raise UserError(f"{path}: entry_point: expected a function name, got {ep!r}")
    prompt, desc = (
        data.get("prompt") or data.get("description"),
        data.get("description") or data.get("prompt"),
    )
    if not isinstance(prompt, str) or not isinstance(desc, str):
        raise UserError(f"{path}: prompt/description: expected text in at least one of them")
    imports = data.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise UserError(f"{path}: imports: expected a list of import lines")
    return Problem(
        id=str(data.get("id", f"user/{ep}")),
        source="user",
        split="test",
        prompt=prompt,
        description=desc,
        entry_point=ep,
        reference_solution="",
        imports=tuple(imports),
    )


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------


def solve(
    problem: Problem, code_policy: Any, test_policy: Any, cfg: Config, executor: Any, n: int | None = None
) -> SolveResult:
    """Test-time collaboration on one problem (see the module docstring)."""
    from tasks.collaboration import select_many
    from tasks.evaluate import generate_codes

    codes = generate_codes([problem], code_policy, cfg, n or cfg.eval.solve_candidates)
    return select_many([problem], codes, test_policy, cfg, executor)[0]


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def format_result(result: SolveResult) -> str:
    """Human-readable chosen code, its tests and the vote table."""
    if result.chosen < 0:
        return f"# no candidate chosen: none of the {len(result.candidates)} candidates is valid Python"
    lines = [f"# chosen candidate {result.chosen} of {len(result.candidates)}", result.code, "", "# tests"]
    lines += [f"{'PASS' if ok else 'FAIL'}  assert {call} == {answer}" for call, answer, ok in result.tests]
    lines += ["", "# vote (candidate: tests passed / valid, agreement)"]
    lines += [
        f"{v.index}: {v.passed}/{v.valid}, {v.agreement}{'  <- chosen' if v.index == result.chosen else ''}"
        for v in result.votes
    ]
    return "\n".join(lines)


MODEL_HELP = (
    "a model folder, hub id or registry URI (models:/codea1-{role}@champion, models:/codea1-{role}/2); "
    "default: eval.{role}_model, else the registry's champion, else the workspace's trained model"
)


def registry_aware(cfg: Config, role: str, override: str | None) -> str | None:
    """``--<role>-model`` with ``models:/`` URIs and the champion default resolved
    (:func:`tracking.registry.cli_model`);
    the choice is said on stderr, so stdout stays the result."""
    from tracking.registry import cli_model

    try:
        path, note = cli_model(cfg, role, override)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(note, file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    """``codea1 solve --problem FILE``; exit 2 with one line on user errors."""
    from codea1_core.method.parsing import silence_parse_warnings

    silence_parse_warnings()
    parser = argparse.ArgumentParser(
        prog="codea1 solve",
        description="Test-time collaboration: pick a Code-LLM candidate with Test-LLM tests.",
    )
    parser.add_argument(
        "--problem", required=True, help="problem file (.json, .yaml or .py; see the module docstring)"
    )
    parser.add_argument("--entry-point", default=None, help="function name (default: from the file)")
    parser.add_argument("--n", type=int, default=None, help="candidates (default: eval.solve_candidates)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--code-model", default=None, help=MODEL_HELP.format(role="code"))
    parser.add_argument("--test-model", default=None, help=MODEL_HELP.format(role="test"))
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)

    def go() -> None:
        from flows.evaluate import evaluated_policy
        from sandbox import make_executor

        problem = load_problem_file(args.problem, args.entry_point)
        cfg = load_stage_config(args.params, list(args.overrides))
        code = evaluated_policy(cfg, "code", registry_aware(cfg, "code", args.code_model))
        test = evaluated_policy(cfg, "test", registry_aware(cfg, "test", args.test_model))
        with make_executor(cfg.sandbox) as executor:
            print(format_result(solve(problem, code, test, cfg, executor, args.n)))

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
