"""Rollout tasks: sample code and tests, parse them, gate the generated tests.

What it does: thin Prefect tasks around ``Policy.generate`` (docs/method.md §3 steps 2-6), the parsers of
``codea1_core.method.parsing`` and the data engineer's GX gate (``tasks.quality.gx_gate_tests``). Sampling seeds are
derived from (cfg.seed, iteration, role), so a resumed run samples what the uninterrupted run sampled.
What it does not: execute anything or compute rewards.

The policies are built (and the rollout backend chosen) in ONE place,
:func:`codea1_core.models.loading.build_policy`; the sampling settings come from
:func:`codea1_core.models.sampling.sampling_params`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config, TestsConfig
from codea1_core.method.batches import iteration_seed
from codea1_core.models.sampling import sampling_params
from codea1_core.types import Problem


def drop_overlong_problems(problems: list[Problem], cfg: Config) -> tuple[list[Problem], list[str]]:
    """Training problems whose Code-LLM prompt fits ``data.max_prompt_tokens`` (§3 step 2), and the dropped ids.

    Counted with the Code LLM's tokenizer and chat template, exactly as the rollout encodes the prompt.
    """
    from transformers import AutoTokenizer

    from codea1_core.method.prompts import code_messages
    from codea1_core.models.policy import prompt_lengths

    limit = cfg.data.max_prompt_tokens
    if limit <= 0 or not problems:
        return problems, []
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.code_path)
    except OSError as exc:
        raise OSError(
            f"model.code_path: cannot load the tokenizer of {cfg.model.code_path!r}: {exc}"
        ) from exc
    lengths = prompt_lengths(tokenizer, [code_messages(p) for p in problems], cfg.model.use_chat_template)
    kept = [p for p, n in zip(problems, lengths, strict=True) if n <= limit]
    dropped = [p.id for p, n in zip(problems, lengths, strict=True) if n > limit]
    return kept, dropped


def _offset(prompts: list[Any]) -> int:
    """Several ranks: this shard's first prompt's index in the step (0 on one rank). ``Policy.generate`` seeds
    each chunk with seed + its first prompt's index, so with ``rollout.batch_size`` dividing the shard's prompt
    count every rank samples exactly what one process samples for the same problems."""
    from codea1_core.models.distributed import rank

    return rank() * len(prompts)


@task(name="rollout_code", task_run_name="rollout_code[it={iteration}]", cache_policy=NO_CACHE)
def rollout_code(policy: Any, problems: list[Problem], cfg: Config, iteration: int) -> list[list[Any]]:
    """M code completions per problem (§3 step 2)."""
    from codea1_core.method.prompts import code_messages

    prompts = [code_messages(p) for p in problems]
    sp = sampling_params(
        cfg, "rollout", "code", iteration_seed(cfg.seed, iteration, "code") + _offset(prompts)
    )
    return policy.generate(prompts, cfg.rollout.n_code, sp)


@task(name="rollout_tests", task_run_name="rollout_tests[it={iteration}]", cache_policy=NO_CACHE)
def rollout_tests(
    policy: Any,
    problems: list[Problem],
    codes: list[list[str]],
    cfg: Config,
    iteration: int,
    blackbox: bool,
    on_chunk: Callable[[int, list[list[Any]]], None] | None = None,
) -> list[list[list[Any]]]:
    """N suites per (problem, code): ``[B][M][N]`` completions (§3 steps 4-5; black-box prompts for Self-Play).

    ``on_chunk(first_prompt_index, rows)`` sees each generation chunk as it is done (prompts are problem-major,
    one per (problem, code)): ``tasks.overlap`` executes finished problems while later ones generate."""
    from codea1_core.method.prompts import test_messages, test_messages_blackbox

    k = cfg.reward.k
    prompts = [
        test_messages_blackbox(p, k) if blackbox else test_messages(p, code, k)
        for p, row in zip(problems, codes, strict=True)
        for code in row
    ]
    sp = sampling_params(
        cfg, "rollout", "test", iteration_seed(cfg.seed, iteration, "test") + _offset(prompts)
    )
    if on_chunk is None:
        flat = policy.generate(prompts, cfg.rollout.n_tests, sp)
    else:
        flat = policy.generate(prompts, cfg.rollout.n_tests, sp, on_chunk=on_chunk)
    out, i = [], 0
    for row in codes:
        out.append(flat[i : i + len(row)])
        i += len(row)
    return out


def extract_codes(completions: list[list[Any]]) -> list[list[str]]:
    """The code block of every completion (§5.1)."""
    from codea1_core.method.parsing import extract_code

    return [[extract_code(c.text) for c in row] for row in completions]


@task(name="gate_tests", task_run_name="gate_tests[it={iteration}]", cache_policy=NO_CACHE)
def gate_tests(
    problems: list[Problem], completions: list[list[list[Any]]], cfg: Config, iteration: int
) -> tuple[list[list[list[Any]]], dict[str, float]]:
    """Parse every suite (§5.2, D5) and drop the tests the GX gate rejects; a rejected test counts invalid.

    The parser records each kept test's reason code (``ParsedSuite.checks``); the gate validates the columns
    of those tests (``gates.generated_tests.gate_columns``) and gives one verdict per row, in the suites'
    order.
    Returns ``suites[b][m][n]`` (``ParsedSuite``) and gate metrics (``test/rejected_rate``, per reason).
    """
    from gates.generated_tests import gate_columns
    from tasks.quality import gx_gate_tests

    suites = parse_suites(problems, completions, cfg.tests)
    table = gate_columns(problems, suites)
    n_rows = len(table["call"])
    if not n_rows:
        return suites, {"test/rejected_rate": 0.0}
    gate = gx_gate_tests.fn(table, cfg.tests)  # inside this task: the GX gate's body, not a nested task run
    apply_gate(suites, gate.reasons)
    return suites, {**gate.metrics(), "test/gate_rows": float(n_rows)}


def parse_suites(
    problems: list[Problem], completions: list[list[list[Any]]], tests_cfg: TestsConfig
) -> list[list[list[Any]]]:
    """``suites[b][m][n]``: every test completion parsed (§5.2, D5) with the ``tests`` section's settings."""
    from codea1_core.method.parsing import extract_tests

    return [
        [
            [
                extract_tests(
                    c.text, p.entry_point, tests_cfg.parse_mode, literal_answers=tests_cfg.literal_answers
                )
                for c in per_code
            ]
            for per_code in per_problem
        ]
        for p, per_problem in zip(problems, completions, strict=True)
    ]


def apply_gate(suites: list[list[list[Any]]], reasons: list[str]) -> None:
    """Drop, in place, the tests whose gate verdict is not ``ok``; each dropped test counts invalid
    (``gate_<reason>``). ``reasons``: one per row, rows in (b, m, n, test) order."""
    from codea1_core.method.validity import OK

    verdicts = iter(reasons)
    for per_problem in suites:
        for per_code in per_problem:
            for n, suite in enumerate(per_code):
                row = [next(verdicts) for _ in suite.tests]
                drop = [f"gate_{r}" for r in row if r != OK]
                if drop:
                    kept = [i for i, r in enumerate(row) if r == OK]
                    per_code[n] = dataclasses.replace(
                        suite,
                        tests=tuple(suite.tests[i] for i in kept),
                        checks=tuple(suite.checks[i] for i in kept),
                        invalid=suite.invalid + len(drop),
                        reasons=(*suite.reasons, *drop),
                    )
