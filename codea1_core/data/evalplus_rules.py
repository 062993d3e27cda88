"""EvalPlus' judging rules, as evalplus 0.3.1 applies them (``evalplus/evaluate.py``, ``evalplus/eval/``).

What it does (pure functions the data layer and the evaluator share):

* **Outputs that are not plain data** (:data:`OUTPUT_NOT_NONE`, :func:`judged_call`): three MBPP+ tasks
  return an ``re.Match`` or ``None`` — Mbpp/737 ``check_str``, Mbpp/787 ``text_match_three``, Mbpp/794
  ``text_starta_endb``. The dataset's own asserts only test the result's truthiness, and EvalPlus stores
  ``out is not None`` as the expected value (``get_groundtruth(..., MBPP_OUTPUT_NOT_NONE_TASKS)``) and
  accepts a candidate whose output is that bool, or whose ``out is not None`` equals it. We do the same
  by rewriting those tasks' calls once, at load time, to
  ``(lambda r: r if isinstance(r, bool) else r is not None)(f(...))``: the reference then yields plain
  bools (no input dropped as "not plain data"), and every consumer — prepare, evaluation, golden rewards,
  the Mistake Book — sees the same call. No other EvalPlus task returns non-plain data (the slow test
  ``tests/sandbox/test_sandbox_evalplus.py`` checks every canonical output is encodable).
* **Comparison** (:func:`outputs_match`): ``out == exp``, EvalPlus' special oracles, then its float rule:
  when ``atol`` is 0 and the expected value is a float or a non-empty list/tuple of floats, ``atol``
  becomes 1e-6 **for the rest of that base/plus run** (evalplus mutates its local ``atol``; we carry it as
  state to agree input by input); a non-exact output passes when ``atol != 0``, ``type(out) ==
  type(exp)``, lengths agree for lists/tuples and ``numpy.allclose(out, exp, rtol=1e-07, atol=atol)``.
  Python semantics otherwise: ``1 == 1.0`` and ``True == 1`` pass, NaN never equals NaN.
* **Time** (:func:`time_limit_s`, :func:`run_cap_s`): each input may take ``max(1 s, 4 x the reference's
  time on it)`` (``DEFAULT_MIN_TIME_LIMIT``, ``DEFAULT_GT_TIME_LIMIT_FACTOR``), and each run (the base
  inputs, then the plus inputs) ``min(60 s, sum of its limits) + 2 s`` in all (``untrusted_check``'s
  ``EVALPLUS_TIMEOUT_PER_TASK`` and join slack, ``evaluate``'s default ``fast_check``): inputs past it fail.
  A verdict under that cap depends on the machine's speed — HumanEval/15's plus inputs come close to it
  on a small loaded machine — as it does in evalplus.

What it does not: run code, or reproduce evalplus' defects (HumanEval/32's ``find_zero`` oracle never
records a pass; its memory limit counts the checker's inherited copy of the expected outputs): those
are listed with their evidence in ``bench/eval_bench.py``.

How to run: ``pytest tests/core/evaluation/test_evalplus_protocol.py``.
"""

from __future__ import annotations

from typing import Any

EVALPLUS_SOURCES = ("humanevalplus", "mbppplus")
"""Problem sources judged by the EvalPlus protocol (``eval.evalplus_protocol``)."""

OUTPUT_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")
"""MBPP+ entry points (Mbpp/737, 787, 794) judged on ``out is not None`` (evalplus' ``MBPP_OUTPUT_NOT_NONE_TASKS``)."""

NOT_NONE_WRAPPER = "(lambda r: r if isinstance(r, bool) else r is not None)"
"""What a call of an :data:`OUTPUT_NOT_NONE` task is wrapped in: a bool stays, anything else becomes
``r is not None`` (evalplus: ``out == exp`` for a bool output, else ``exp == (out is not None)``)."""

MIN_TIME_LIMIT_S = 1.0
"""evalplus ``DEFAULT_MIN_TIME_LIMIT``."""
TIME_LIMIT_FACTOR = 4.0
"""evalplus ``DEFAULT_GT_TIME_LIMIT_FACTOR``."""
RUN_CAP_S = 60.0
"""evalplus ``EVALPLUS_TIMEOUT_PER_TASK`` default: the cap of one base or plus run."""
RUN_SLACK_S = 2.0
"""evalplus: ``+ 1`` on the run's timeout and ``+ 1`` on its ``join``."""
FLOAT_ATOL = 1e-6
"""The atol evalplus enforces for float expected values of a task whose atol is 0."""
FLOAT_RTOL = 1e-7
"""evalplus' explicit ``rtol`` of ``np.allclose`` (numpy.testing's default)."""


def judged_call(source: str, entry_point: str, call: str) -> str:
    """The call as EvalPlus judges it: wrapped for :data:`OUTPUT_NOT_NONE` MBPP+ tasks, else unchanged."""
    if source == "mbppplus" and entry_point in OUTPUT_NOT_NONE and not call.startswith(NOT_NONE_WRAPPER):
        return f"{NOT_NONE_WRAPPER}({call})"
    return call


def time_limit_s(reference_s: float) -> float:
    """Per-input time limit: ``max(1 s, 4 x reference time)`` (evalplus ``untrusted_check``)."""
    return max(MIN_TIME_LIMIT_S, TIME_LIMIT_FACTOR * max(0.0, float(reference_s)))


def run_cap_s(limits: list[float]) -> float:
    """Time allowed to one base or plus run: ``min(60 s, sum of its per-input limits) + 2 s``."""
    return min(RUN_CAP_S, sum(limits)) + RUN_SLACK_S


def is_floats(x: Any) -> bool:
    """evalplus ``is_floats``: a float, or a non-empty list/tuple of floats."""
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def outputs_match(out: Any, exp: Any, atol: float, exact: bool | None = None) -> tuple[bool, float]:
    """EvalPlus' verdict of one input, and the ``atol`` the next input of the same run starts with.

    Args:
        out: the candidate's output; exp: the expected output.
        atol: the run's current ``atol`` (the task's, until a float expected value set it to 1e-6).
        exact: the special oracle's ``exact_match`` when the task has one, else None (``out == exp``).
    """
    if exact is None:
        try:
            exact = bool(out == exp)
        except Exception:  # an output whose comparison raises fails that input, as in evalplus
            return False, atol
    if atol == 0 and is_floats(exp):
        atol = FLOAT_ATOL
    if exact or atol == 0:
        return bool(exact), atol
    if type(out) is not type(exp):
        return False, atol
    if isinstance(exp, (list, tuple)) and len(out) != len(exp):
        return False, atol
    import numpy as np

    try:
        return bool(np.allclose(out, exp, rtol=FLOAT_RTOL, atol=atol)), atol
    except Exception:  # non-numeric or ragged values: np.allclose raises, evalplus counts a failure
        return False, atol
