"""Plain data types shared by every layer: problems, tests, execution outcomes, outcome matrices.

Pure dataclasses, no behaviour beyond (de)serialisation helpers. The sandbox produces
:class:`CallOutcome`; rewards and the Mistake Book are pure functions of an :class:`OutcomeMatrix`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

CallStatus = Literal["ok", "error", "timeout", "memory", "unsupported_output", "program_error", "infra_error"]
CALL_STATUSES: tuple[str, ...] = (
    "ok",
    "error",
    "timeout",
    "memory",
    "unsupported_output",
    "program_error",
    "infra_error",
)


@dataclass(frozen=True)
class CallOutcome:
    """What one call of a program did, as observed by the trusted parent.

    ``value`` is the decoded plain value when ``status == "ok"`` (else None); ``error`` is
    ``"ExcType: message"`` for failures. ``infra_error`` means the executor failed, not the program:
    it is never scored (ALGORITHM.md D4).
    """

    status: CallStatus
    value: Any = None
    error: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class TestCase:
    """One golden or generated test: a call of the entry point and its expected value.

    The expected value always comes from running the reference solution on ``call`` (D1).
    """

    __test__ = False  # not a pytest class

    call: str
    expected: Any


@dataclass(frozen=True)
class Problem:
    """A programming problem with a reference solution and golden tests."""

    id: str
    """Globally unique, e.g. ``HumanEval/0``, ``Mbpp/2``, ``mbpp/601``, ``lab/clamp/3``."""
    source: str
    """``humanevalplus``, ``mbppplus``, ``mbpp``, ``humaneval``, ``kodcode``, ``lab``, ..."""
    split: str
    """``train``, ``val`` or ``test``."""
    prompt: str
    """Code-role problem text (HumanEval: signature + docstring; MBPP: ``def`` line + docstring)."""
    description: str
    """Test-role problem description (``clean_description``)."""
    entry_point: str
    """Name of the function the tests call."""
    reference_solution: str
    """Complete, self-contained reference code (imports included)."""
    tests: tuple[TestCase, ...] = ()
    """Golden tests (calls with reference-computed expected values)."""
    imports: tuple[str, ...] = ()
    """Import lines the problem needs (also present in ``reference_solution``)."""
    atol: float = 0.0
    """Absolute float tolerance of the benchmark (EvalPlus ``atol``); 0 = the sandbox default."""
    plus_tests: tuple[TestCase, ...] = ()
    """EvalPlus ``plus_input`` tests (``tests`` holds the base inputs)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form extra data (family name, parameters, difficulty, ...)."""
