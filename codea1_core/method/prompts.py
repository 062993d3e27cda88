"""Prompt builders for both roles (docs/method.md §4), as chat messages.

What it does: turns a :class:`~codea1_core.types.Problem` (and, for the white-box Test LLM, one
candidate program) into ``[{"role": "system", ...}, {"role": "user", ...}]`` messages, and renders
messages as plain text for models without a chat template (:func:`render_plain`).

What it does not do: tokenize, apply a chat template, or truncate (an over-long test prompt is an
error of the caller, §3 step 5). The wording paraphrases the official prompts (§4: "prompts are
paraphrased"); the structure (system line, Question/Buggy Code sections, the assert form) follows them.
Every builder is deterministic: same inputs, same messages.

How to run: ``python -c "from codea1_core import prompts, lab; ..."``; tests in ``tests/core/method/test_prompts.py``.
"""

from __future__ import annotations

import re

from codea1_core.types import Problem

Message = dict[str, str]

CODE_SYSTEM = "You are a helpful code completion assistant."
"""§4.1 system line (official wording)."""
TEST_SYSTEM = "You are a helpful test case generation assistant."
"""§4.2 system line (official wording)."""

CODE_INSTRUCTION = (
    "Complete the function for the question below. "
    "Output the complete function in a single Python code block and nothing else."
)
"""§4.1 instruction sentence (paraphrased)."""

_ROLES = ("system", "user", "assistant")


def _fence(code: str) -> str:
    """A backtick fence longer than any backtick run inside ``code`` (CommonMark), at least 3."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def code_messages(problem: Problem) -> list[Message]:
    """Code-LLM prompt (§4.1): instruction, a blank line, then ``Question:`` and the problem text.

    Args:
        problem: the problem; ``problem.prompt`` is the code-role text (signature + docstring).

    Returns:
        ``[system, user]`` chat messages.
    """
    user = f"{CODE_INSTRUCTION}\n\nQuestion:\n{problem.prompt.strip()}"
    return [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": user}]


def _strategy() -> str:
    return (
        "## Strategy\n"
        "1. Attack logic gaps: places where the code is simpler than the question demands "
        "(missed constraints, misread rules, over-simplified logic).\n"
        "2. Prefer complex inputs: boundaries, nested loops, compound conditions, rare branches.\n"
        "3. Avoid trivial or repetitive tests. Only the first few tests are evaluated, so quality and "
        "order matter."
    )


def _output_format(entry_point: str, k: int) -> str:
    return (
        "## Output format\n"
        f"Write all {k} asserts in ONE Python code block, one per line, each of the form "
        f"`assert {entry_point}(parameters) == answer`."
    )


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (tests per suite) must be a positive int, got {k!r}")


def test_messages(problem: Problem, code: str, k: int = 8) -> list[Message]:
    """White-box Test-LLM prompt (§4.2): five Markdown sections around one candidate program.

    The candidate is always labelled "Buggy Code", even when it is correct (as official).

    Args:
        problem: the problem; ``problem.description`` is the test-role text.
        code: the extracted candidate code of one Code-LLM sample.
        k: number of tests to ask for (K, ``reward.k``).

    Returns:
        ``[system, user]`` chat messages.
    """
    _check_k(k)
    fence = _fence(code)
    user = "\n\n".join(
        [
            '## Role\nYou specialize in finding inputs on which the given "Buggy Code" deviates from '
            'the requirements of the "Question".',
            f"## Task\nWrite {k} assertion-based tests that expose bugs in the function "
            f"`{problem.entry_point}` shown in Buggy Code, judged against the Question.",
            _strategy(),
            f"## Context\nQuestion:\n{problem.description.strip()}\n\n"
            f"Buggy Code:\n{fence}python\n{code.strip()}\n{fence}",
            _output_format(problem.entry_point, k),
        ]
    )
    return [{"role": "system", "content": TEST_SYSTEM}, {"role": "user", "content": user}]


def test_messages_blackbox(problem: Problem, k: int = 8) -> list[Message]:
    """Black-box Test-LLM prompt for the Self-Play baseline (D10, §18.1 item 8): no code shown.

    Same sections as :func:`test_messages`, but the tests target any implementation of the question.
    """
    _check_k(k)
    user = "\n\n".join(
        [
            '## Role\nYou specialize in finding inputs on which an implementation of the "Question" '
            "is likely to deviate from its requirements.",
            f"## Task\nWrite {k} assertion-based tests for the function `{problem.entry_point}` that a "
            "correct solution passes and a subtly wrong one fails.",
            _strategy(),
            f"## Context\nQuestion:\n{problem.description.strip()}",
            _output_format(problem.entry_point, k),
        ]
    )
    return [{"role": "system", "content": TEST_SYSTEM}, {"role": "user", "content": user}]


# pytest would otherwise try to collect the two ``test_*`` builders when a test module imports them.
test_messages.__test__ = False  # type: ignore[attr-defined]
test_messages_blackbox.__test__ = False  # type: ignore[attr-defined]


def render_plain(messages: list[Message]) -> str:
    r"""Plain-text form of chat messages for models without a chat template.

    Each message becomes ``"<Role>:\n<content>"``, separated by blank lines, and the text ends with
    ``"Assistant:\n"`` so a model continues with the assistant's answer. A trailing assistant
    message is treated as a partial answer to continue (no new header is added).

    Raises:
        ValueError: on an empty list, an unknown role, or a non-string content.
    """
    if not messages:
        raise ValueError("render_plain: no messages")
    parts = []
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role not in _ROLES:
            raise ValueError(f"render_plain: message {i} has role {role!r}; expected one of {_ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"render_plain: message {i} content must be str, got {type(content).__name__}")
        parts.append(f"{role.capitalize()}:\n{content}")
    if messages[-1]["role"] == "assistant":
        return "\n\n".join(parts)
    return "\n\n".join(parts) + "\n\nAssistant:\n"
