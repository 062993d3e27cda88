"""Test-time collaboration (solve) and attack: selection, problem files, findings, user errors.

Policies are fakes returning fixed text; execution uses the in-process fake executor of
``test_evaluation.py`` (the real sandbox is exercised in ``test_eval_sanity.py``).
"""

from __future__ import annotations

import json

import pytest
from support import FakeExecutor, TextPolicy, fenced, problem

from codea1_core.config import Config
from flows.attack import attack, format_report, load_target
from flows.attack import main as attack_main
from flows.common import UserError
from flows.solve import format_result, load_problem_file, solve
from flows.solve import main as solve_main
from tasks.collaboration import select_many, solve_benchmark

CFG = Config.from_dict({"eval": {"solve_candidates": 3}, "tracking": {"backend": "null"}})
GOOD = "def add(a, b):\n    return a + b"
BUGGY = "def add(a, b):\n    return a - b"
OFF = "def add(a, b):\n    return a + b + (a > 4)"


class CyclePolicy:
    """Fake Code LLM: the i-th sample of every prompt is ``codes[i % len(codes)]``."""

    def __init__(self, codes):
        self.codes = codes

    def generate(self, prompts, n, sampling):
        from types import SimpleNamespace

        return [
            [SimpleNamespace(text=fenced(self.codes[i % len(self.codes)])) for i in range(n)] for _ in prompts
        ]


TESTER = TextPolicy(
    lambda text: fenced("assert add(1, 2) == 3\nassert add(5, 5) == 10\nassert add(2, 2) == 4")
)


def test_solve_picks_the_candidate_passing_most_tests():
    res = solve(problem(), CyclePolicy([BUGGY, OFF, GOOD]), TESTER, CFG, FakeExecutor())
    assert res.code == GOOD and res.chosen == 2
    assert [v.passed for v in res.votes] == [0, 2, 3]
    assert all(ok for _, _, ok in res.tests) and len(res.tests) == 3
    text = format_result(res)
    assert "chosen candidate 2 of 3" in text and "PASS  assert add(1, 2) == 3" in text


def test_solve_tie_break_prefers_output_agreement():
    # all three pass the first test and fail the second, where OFF's output (11) differs from the others' (10)
    tester = TextPolicy(lambda text: fenced("assert add(1, 1) == 2\nassert add(5, 5) == 99"))
    res = select_many(
        [problem()], [[OFF, GOOD, GOOD.replace("a + b", "b + a")]], tester, CFG, FakeExecutor()
    )[0]
    assert [(v.passed, v.agreement) for v in res.votes] == [(1, 2), (1, 3), (1, 3)]
    assert res.chosen == 1  # tie on tests and agreement -> the earliest


def test_solve_benchmark_reports_chosen_vs_candidates():
    ps = [problem("a"), problem("b")]
    m = solve_benchmark.fn(ps, CyclePolicy([BUGGY, OFF, GOOD]), TESTER, CFG, FakeExecutor(), "toy")
    assert m["solve/toy/pass@1"] == 100.0
    assert m["solve/toy/candidates/pass@1"] == pytest.approx(100 / 3)
    assert m["solve/toy/candidates/best_of_n"] == 100.0


def test_problem_files_json_yaml_py_and_errors(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(
        json.dumps({"entry_point": "add", "description": "Add two ints.", "imports": ["import math"]})
    )
    p = load_problem_file(j)
    assert (p.entry_point, p.prompt, p.imports) == ("add", "Add two ints.", ("import math",))
    y = tmp_path / "p.yaml"
    y.write_text("entry_point: add\nprompt: |\n  def add(a, b):\n      '''Add.'''\n")
    assert load_problem_file(y).description.startswith("def add")
    py = tmp_path / "p.py"
    py.write_text(
        "from typing import List\n\ndef helper(): pass\n\ndef total(xs: List[int]) -> int:\n    '''Sum of xs.'''\n"
    )
    p = load_problem_file(py)
    assert (p.entry_point, p.description, p.imports) == ("total", "Sum of xs.", ("from typing import List",))
    with pytest.raises(UserError, match="missing.yaml: problem file not found"):
        load_problem_file(tmp_path / "missing.yaml")
    (tmp_path / "bad.json").write_text(json.dumps({"prompt": "x"}))
    with pytest.raises(UserError, match="bad.json: entry_point"):
        load_problem_file(tmp_path / "bad.json")
    assert solve_main(["--problem", str(tmp_path / "nope.json")]) == 2


SUT = '''
def median(xs):
    """Median of a non-empty list of numbers."""
    xs = sorted(xs)
    return xs[len(xs) // 2]
'''


def test_attack_reports_disagreements_and_errors(tmp_path):
    f = tmp_path / "sut.py"
    f.write_text(SUT)
    prob = load_target(f"{f}::median")
    assert prob.description.startswith("Median of")
    tester = TextPolicy(
        lambda text: fenced(
            "assert median([3, 1, 2]) == 2\nassert median([1, 2, 3, 4]) == 2.5\n"
            "assert median([]) == None\nassert median([1]) == undefined_name\nassert median([1]) != 1"
        )
    )
    rep = attack(prob, tester, CFG, FakeExecutor())
    assert [f.call for f in rep.agreed] == ["median([3, 1, 2])"]
    assert [(f.call, f.actual) for f in rep.disagreements] == [("median([1, 2, 3, 4])", "3")]
    assert rep.errors[0].call == "median([])" and "IndexError" in rep.errors[0].actual
    # `== undefined_name` is not plain data: rejected at parsing (tests.literal_answers), like the `!=` form
    assert not rep.invalid and rep.unparsed == 2 and rep.tests == 3
    text = format_report(rep)
    assert "1 disagreement(s)" in text and "predicted: 2.5" in text


def test_attack_user_errors_are_one_line(tmp_path, capsys):
    f = tmp_path / "sut.py"
    f.write_text(SUT)
    with pytest.raises(UserError, match="no top-level function named 'mean'"):
        load_target(f"{f}::mean")
    with pytest.raises(UserError, match="expected FILE.py::function"):
        load_target(str(f))
    assert attack_main([f"{tmp_path / 'none.py'}::f"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.py: file not found" in err[0]


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("solve", ["--problem", "--params"]),
        ("attack", ["target", "--params"]),
        ("serve", ["--cron", "--limit"]),
    ],
)
def test_cli_help_lists_the_real_options(command: str, options: list[str]) -> None:
    """Regression: `codea1 solve/attack/serve --help` listed no options."""
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert f"usage: codea1 {command}" in result.output
    for option in options:
        assert option in result.output, (option, result.output)


def test_solve_never_chooses_a_candidate_that_does_not_parse():
    """Regression: `solve` returned a "chosen candidate" that was not valid Python."""
    broken = "def add(a, b):\n    return a +"  # the executor may still "pass" it: the parser must decide
    res = select_many([problem()], [[broken, BUGGY]], TESTER, CFG, FakeExecutor())[0]
    assert res.code == BUGGY and res.chosen == 1
    none = select_many([problem()], [[broken]], TESTER, CFG, FakeExecutor())[0]
    assert (none.code, none.chosen) == ("", -1)
    assert "none of the 1 candidates is valid Python" in format_result(none)


def test_attack_ranks_findings_by_agreement_across_suites(tmp_path):
    """Findings come most-agreed first, with how many suites wrote each test."""
    f = tmp_path / "sut.py"
    f.write_text(SUT)
    suites = iter(
        ["assert median([1, 2]) == 1.5", "assert median([4, 2]) == 3.0\nassert median([1, 2]) == 1.5"]
    )
    rep = attack(
        load_target(f"{f}::median"), TextPolicy(lambda text: fenced(next(suites))), CFG, FakeExecutor(), 2
    )
    assert [(x.call, x.support) for x in rep.disagreements] == [("median([1, 2])", 2), ("median([4, 2])", 1)]
    assert "[2/2] median([1, 2])" in format_report(rep)


def test_attack_says_when_the_lab_toy_meets_a_function_outside_its_training():
    """Regression: `attack` on a non-lab function returned the tiny model's noise without saying so."""
    from flows.attack import toy_model_note

    note = toy_model_note(Config(), "median", None)
    assert note.startswith("note: the Test LLM is the built-in lab toy") and "'median'" in note
    assert toy_model_note(Config(), "median", "my/model") == ""  # the user's own model: no caveat
    from codea1_core.data.lab import training_family_names

    lab_name = training_family_names(Config().lab)[0]
    assert toy_model_note(Config(), lab_name, None) == ""


class _BrokenSandbox:
    """Every call fails for infrastructure reasons (a dead worker pool), however often it is retried."""

    def __init__(self) -> None:
        self.rounds = 0

    def run_many(self, jobs):
        from codea1_core.types import CallOutcome

        self.rounds += 1
        return [[CallOutcome("infra_error", error="worker died") for _ in exprs] for _, exprs in jobs]


def test_solve_and_attack_abort_on_infra_failures_instead_of_scoring_them(tmp_path):
    """Regression: ``solve`` ran the sandbox without any infra guard, so a dead worker pool
    counted as failed tests and failed samples (a score); ``attack`` had its own copy of the guard
    (a bare RuntimeError, no retry). Both now go through ``tasks.execute.run_jobs``."""
    from tasks.execute import InfraFailure

    ex = _BrokenSandbox()
    with pytest.raises(InfraFailure, match=r"solve: \d+/\d+ calls hit sandbox infrastructure errors"):
        select_many([problem()], [[GOOD, BUGGY]], TESTER, CFG, ex)
    assert ex.rounds == 2  # retried once, as training does
    with pytest.raises(InfraFailure, match="solve"):
        solve_benchmark.fn([problem()], CyclePolicy([GOOD]), TESTER, CFG, _BrokenSandbox(), "toy")
    f = tmp_path / "sut.py"
    f.write_text(SUT)
    tester = TextPolicy(lambda text: fenced("assert median([3, 1, 2]) == 2"))
    with pytest.raises(
        InfraFailure, match=r"attack on median: .*attack's limit=0\.0\); first error: worker died"
    ):
        attack(load_target(f"{f}::median"), tester, CFG, _BrokenSandbox())
