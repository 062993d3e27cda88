"""Prompt builders (docs/method.md §4): structure, determinism, and that the code round-trips through parsing."""

from __future__ import annotations

import pytest

from codea1_core.method import prompts
from codea1_core.method.parsing import extract_code
from codea1_core.types import Problem

PROBLEM = Problem(
    id="lab/clamp/0",
    source="lab",
    split="train",
    prompt='def clamp(x, lo, hi):\n    """Clamp x into [lo, hi]."""\n',
    description="Write clamp(x, lo, hi) that returns x limited to the closed range [lo, hi].",
    entry_point="clamp",
    reference_solution="def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
)
CODE = "def clamp(x, lo, hi):\n    return min(x, hi)"


def test_code_messages_follow_section_4_1():
    msgs = prompts.code_messages(PROBLEM)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == "You are a helpful code completion assistant."
    user = msgs[1]["content"]
    instruction, rest = user.split("\n\n", 1)
    assert "single Python code block" in instruction
    assert rest == "Question:\n" + PROBLEM.prompt.strip()
    assert prompts.code_messages(PROBLEM) == msgs  # deterministic


def test_white_box_prompt_has_five_sections_and_the_buggy_code():
    msgs = prompts.test_messages(PROBLEM, CODE, k=6)
    assert msgs[0] == {"role": "system", "content": "You are a helpful test case generation assistant."}
    user = msgs[1]["content"]
    headers = [line for line in user.splitlines() if line.startswith("## ")]
    assert headers == ["## Role", "## Task", "## Strategy", "## Context", "## Output format"]
    assert "Write 6 assertion-based tests" in user
    assert "Question:\n" + PROBLEM.description in user
    assert "Buggy Code:\n```python\n" + CODE + "\n```" in user
    assert "`assert clamp(parameters) == answer`" in user
    assert "ONE Python code block" in user
    # the candidate inside the prompt is exactly what the code extractor gets back
    assert extract_code(user) == CODE
    assert prompts.test_messages(PROBLEM, CODE, k=6) == msgs


def test_white_box_prompt_survives_code_containing_a_fence():
    code = 'def clamp(x, lo, hi):\n    s = "```"\n    return x'
    user = prompts.test_messages(PROBLEM, code)[1]["content"]
    assert "Buggy Code:\n````python\n" + code + "\n````" in user


def test_black_box_prompt_shows_no_code():
    user = prompts.test_messages_blackbox(PROBLEM, k=8)[1]["content"]
    assert "Buggy Code" not in user and "```" not in user
    assert PROBLEM.description in user and "Write 8 assertion-based tests" in user
    assert "`assert clamp(parameters) == answer`" in user


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_bad_k_is_rejected(k):
    with pytest.raises(ValueError, match="k"):
        prompts.test_messages(PROBLEM, CODE, k=k)


def test_render_plain_ends_with_the_assistant_turn():
    text = prompts.render_plain(prompts.code_messages(PROBLEM))
    assert text.startswith("System:\nYou are a helpful code completion assistant.\n\nUser:\n")
    assert text.endswith("\n\nAssistant:\n")
    assert PROBLEM.prompt.strip() in text
    partial = prompts.render_plain(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "```"}]
    )
    assert partial == "User:\nhi\n\nAssistant:\n```"


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "no messages"),
        ([{"role": "tool", "content": "x"}], "role 'tool'"),
        ([{"role": "user"}], "content"),
    ],
)
def test_render_plain_rejects_malformed_messages(messages, match):
    with pytest.raises(ValueError, match=match):
        prompts.render_plain(messages)


def test_prompt_builders_are_not_collected_as_tests():
    assert prompts.test_messages.__test__ is False
    assert prompts.test_messages_blackbox.__test__ is False
