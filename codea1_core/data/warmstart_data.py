"""The lab's warm-start data: supervised conversations of both roles, and the corpus of the tiny tokenizer.

What it does: :func:`warmstart_examples` turns lab problems into conversations (TRL conversational format) for
one role's supervised warm start: fenced solutions (some buggy) for the Code LLM, IMPERFECT suites (some
ordinary inputs, some wrong predicted answers, sometimes fewer than ``k`` asserts) for the Test LLM;
:func:`tokenizer_corpus` collects every kind of text the tiny models see, for training their BPE tokenizer;
:func:`render_chatml` renders messages as the tiny model's chat template does.

What it does not: make the problems (:mod:`codea1_core.data.lab`: families, splits, and the Code LLM's extra
warm-start problems), or train anything (``flows/warmstart.py``, ``codea1_core/models/sft.py``).

How to run: ``python -c "from codea1_core.data.warmstart_data import tokenizer_corpus; from codea1_core.config
import LabConfig; print(len(tokenizer_corpus(LabConfig())))"``; tests in ``tests/core/data/test_lab.py`` and
``tests/core/data/test_warmstart_data.py``.
"""

from __future__ import annotations

import random
from typing import Any

from codea1_core.config import LabConfig
from codea1_core.data.lab import FAMILIES, SPLITS, buggy_variants, call_text, evaluate_trusted, lab_problems
from codea1_core.types import Problem

_SUITE_SHORT_FRAC = 0.3
"""Warm-start test suites: share that holds fewer than K asserts."""
_TYPICAL_CALL_FRAC = 0.35
"""Warm-start test suites: share of asserts on ordinary (non-boundary) inputs."""
_WRONG_ANSWER_FRAC = 0.15
"""Warm-start test suites: share of asserts whose predicted answer is wrong (invalid under §7)."""


def _wrong_answer(value: Any, rng: random.Random) -> Any:
    """A plausible but wrong predicted answer of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([-1, 1])
    if isinstance(value, str):
        return value + "!" if rng.random() < 0.5 else value[:-1] or "x"
    if isinstance(value, list):
        return value[:-1] if value else [0]
    return None


def _imperfect_suite(problem: Problem, rng: random.Random, k: int) -> str:
    """An assistant answer with up to ``k`` asserts: mostly golden calls, some ordinary, some wrong."""
    family = FAMILIES.get(problem.metadata.get("family", ""))
    n_tests = k if rng.random() >= _SUITE_SHORT_FRAC else rng.randint(max(1, k // 2), max(1, k - 1))
    calls: list[str] = []
    for _ in range(4 * n_tests):
        if len(calls) == n_tests:
            break
        if family is not None and (rng.random() < _TYPICAL_CALL_FRAC or not problem.tests):
            call = call_text(family.name, family.typical(problem.metadata["params"], rng))
        elif problem.tests:
            call = rng.choice(problem.tests).call
        else:
            break
        if call not in calls:
            calls.append(call)
    expected = evaluate_trusted(problem.reference_solution, calls)  # trusted reference (D1)
    lines = []
    for call, value in zip(calls, expected, strict=True):
        if isinstance(value, Exception):
            continue
        if rng.random() < _WRONG_ANSWER_FRAC:
            value = _wrong_answer(value, rng)
        lines.append(f"assert {call} == {value!r}")
    return "```python\n" + "\n".join(lines) + "\n```"


def warmstart_examples(
    problems: list[Problem], role: str, lab_cfg: LabConfig, seed: int, *, k: int = 8, blackbox: bool = False
) -> list[dict]:
    """Supervised conversations (TRL conversational format) for the warm start of one role.

    Code role: ``code_messages(problem)`` answered with a fenced solution, buggy with probability
    ``lab_cfg.buggy_fraction`` (so RL has room to improve). Test role: ``test_messages(problem, code, k)``
    for a correct or buggy candidate, answered with an IMPERFECT suite: some ordinary inputs, some
    wrong predicted answers, sometimes fewer than ``k`` asserts.

    Args:
        problems: Problems to draw from (lab problems carry buggy variants; others get only correct code).
        role: ``code`` or ``test``.
        lab_cfg: The ``lab`` section (``buggy_fraction``, ``warmstart_<role>_examples_per_problem``).
        seed: Seed; the same arguments always give the same examples.
        k: Tests per suite requested by the test prompt (``reward.k``).
        blackbox: Test role only: use the black-box prompt (no code shown; ``selfplay`` mode).

    Returns:
        ``[{"messages": [system, user, assistant]}, ...]``, ``warmstart_<role>_examples_per_problem`` per problem.
    """
    from codea1_core.method.prompts import code_messages, test_messages, test_messages_blackbox

    if role not in ("code", "test"):
        raise ValueError(f"role: expected 'code' or 'test', got {role!r}")
    examples = []
    for problem in problems:
        rng = random.Random(f"codea1-warmstart/{seed}/{role}/{problem.id}")
        bugs = buggy_variants(problem)
        for _ in range(getattr(lab_cfg, f"warmstart_{role}_examples_per_problem")):
            buggy = bool(bugs) and rng.random() < lab_cfg.buggy_fraction
            code = rng.choice(bugs) if buggy else problem.reference_solution
            if role == "code":
                messages = code_messages(problem)
                answer = f"```python\n{code}\n```"
            else:
                messages = test_messages_blackbox(problem, k) if blackbox else test_messages(problem, code, k)
                answer = _imperfect_suite(problem, rng, k)
            examples.append({"messages": [*messages, {"role": "assistant", "content": answer}]})
    return examples


def render_chatml(messages: list[dict]) -> str:
    """Messages in the Qwen (ChatML) layout, as the tiny model's chat template renders them."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def tokenizer_corpus(lab_cfg: LabConfig, *, k: int = 8) -> list[str]:
    """Every kind of text the tiny models see, for training their BPE tokenizer.

    Covers all splits and held-out families (the tokenizer only learns merges, no behaviour): prompts
    and descriptions, references and buggy variants, golden asserts, and rendered conversations of
    both roles (chat-templated and plain), including the black-box test prompt.
    """
    from dataclasses import replace

    from codea1_core.method.prompts import render_plain, test_messages_blackbox

    # The boundary layout in every mode: the tokenizer (and so the initial model) must not depend on
    # which golden tests training sees, or the sparse and boundary arms would start from different models.
    as_boundary = replace(lab_cfg, golden_tests="boundary")
    problems = [p for split in SPLITS for p in lab_problems(as_boundary, split)]
    texts: list[str] = []
    for p in problems:
        texts += [p.prompt, p.description, p.reference_solution, *buggy_variants(p)]
        texts += [f"assert {t.call} == {t.expected!r}" for t in p.tests]
        texts.append(render_chatml(test_messages_blackbox(p, k)))
    one_each = replace(
        as_boundary, warmstart_code_examples_per_problem=1, warmstart_test_examples_per_problem=1
    )
    for role in ("code", "test"):
        for example in warmstart_examples(problems, role, one_each, lab_cfg.seed, k=k):
            texts += [render_chatml(example["messages"]), render_plain(example["messages"])]
    return texts
