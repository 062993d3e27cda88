"""The evaluation path of generated tests (``codea1_core.evaluation.suites.plan_suites``) runs no gate: the
parser's allow-list is what keeps a call from rebinding a name of the reference, so a false assert is never
judged correct. Runs the real sandbox (one worker, a few seconds).
"""

from __future__ import annotations

import pytest

from codea1_core.evaluation.suites import plan_suites
from codea1_core.types import Problem
from sandbox import ExecLimits, ProcessExecutor

# An entry point named like a common method, whose reference calls a builtin.
REFERENCE = "def count(xs):\n    return sorted(xs)\n"
PROBLEM = Problem(
    id="toy/count",
    source="lab",
    split="test",
    prompt="def count(xs):",
    description="count(xs) returns xs sorted.",
    entry_point="count",
    reference_solution=REFERENCE,
)
FALSE_ASSERTS = [
    "assert count((sorted := lambda *a: [7]) and [3, 1]) == [7]",  # walrus: rebinds the builtin
    "assert count([(sorted := lambda *a: [7]) for _ in [0]] and [3, 1]) == [7]",  # walrus in a comprehension
    "assert count((x for x in [0]).gi_frame.f_globals.update(sorted=lambda *a: [7]) or [3, 1]) == [7]",
]


@pytest.mark.parametrize("line", FALSE_ASSERTS)
def test_a_call_that_rebinds_a_name_of_the_reference_is_refused_not_judged(line: str) -> None:
    """On the reference each false assert holds (its call rebinds ``sorted`` before ``count`` runs): the
    plan must refuse it, counted as generated and wrong, and run nothing for it."""
    text = f"```python\n{line}\nassert count([3, 1]) == [1, 3]\n```"
    plan = plan_suites([PROBLEM], [text], k=5, parse_mode="strict", literal_answers=True)
    assert [t.call for t in plan.suites[0]] == ["count([3, 1])"] and plan.generated == (2,)
    with ProcessExecutor(workers=1, limits=ExecLimits(call_timeout_s=2.0, isolate_calls=True)) as ex:
        outcomes = [ex.run(source, exprs) for source, exprs in plan.reference_jobs()]
    verdicts = plan.reference_verdicts(outcomes, 1e-6, 1e-6)
    assert [v.correct for v in verdicts[0] or []] == [True]  # only the honest assert, and it holds
    records = plan.records(verdicts, [[]], [], 1e-6, 1e-6)
    assert records[0].generated == 2 and sum(v.correct for v in records[0].verdicts) == 1


def test_the_false_assert_does_hold_on_the_reference_when_run() -> None:
    """The hazard is real: run as written, the rebinding call returns the predicted answer."""
    calls = ["count((sorted := lambda *a: [7]) and [3, 1])", "[7]"]
    with ProcessExecutor(workers=1, limits=ExecLimits(call_timeout_s=2.0, isolate_calls=True)) as ex:
        got = ex.run(REFERENCE, calls)
    assert [o.value for o in got] == [[7], [7]]
