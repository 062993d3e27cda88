"""The limits of one program run: :class:`ExecLimits`, the knobs every executor and worker reads.

What it does: holds and validates the per-call and per-program limits (time, memory, output, files,
processes, result sizes, decode budget, call isolation); the modules that apply them read it
(``sandbox/confinement.py``: rlimits of each child; ``sandbox/supervision.py``: the worker's clocks and caps;
``sandbox/decoding.py``: the parent's decode budget).

What it does not: apply anything (no system call here), or pick the project's settings (``sandbox/factory.py``
maps ``params.yaml``'s ``sandbox`` section onto it). Tested by ``tests/sandbox/test_sandbox.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecLimits:
    """Limits of one program run (docs/method.md D3)."""

    call_timeout_s: float = 2.0
    """Wall-clock limit of one call (expression); a time-out fails only that call."""
    program_timeout_s: float = 10.0
    """Wall-clock cap of the whole program; calls left unrun count as time-outs."""
    memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS) of the child."""
    max_output_bytes: int = 65536
    """Captured stdout+stderr is truncated to this many bytes (the rest is drained and dropped)."""
    define_timeout_s: float | None = None
    """Limit of the program's top level (definition); None = ``call_timeout_s``."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE of the child and size of each private tmpfs."""
    max_open_files: int = 256
    """RLIMIT_NOFILE of the child."""
    max_processes: int = 64
    """RLIMIT_NPROC of the dedicated uid, threads included (only enforced when privileges are dropped)."""
    max_value_bytes: int = 64 * 1024 * 1024
    """Largest encoded result of one call; larger results are ``unsupported_output``."""
    max_result_bytes: int = 256 * 1024 * 1024
    """Largest total of encoded results of one program (all its calls): a call that would pass it is
    ``unsupported_output`` "result too large". With the decode budget (``sandbox/decoding.py``) this bounds
    the parent's memory per program, hence per batch, whatever the programs return. The default keeps
    every EvalPlus reference whole: prepare's 100-call chunks of HumanEval/15 plus inputs total ~145 MB."""
    isolate_calls: bool = True
    """Each call runs in its own forked copy of the defined program, so no call can change what
    another returns (a call whose argument rebinds the function under test, patches a builtin or
    leaves state in the program's objects). Only calls that bring code of their own are forked
    (``sandbox/harness.py``, ``plain``): a call of a function the program defined, on constants, runs in
    the program's process (dataset inputs cost no fork). On by default, as in every executor the project
    builds (``sandbox.isolate_calls``, ``sandbox/factory.py``). ``False`` is the weaker, opt-in mode: all
    calls in one namespace, in order, so one call can change what every later call returns (the
    official protocol's behaviour, and the benchmarks' shared-namespace arm)."""
    max_decode_s: float = 60.0
    """CPU seconds the trusted parent may spend decoding one program's results; calls past it are
    ``unsupported_output`` (``sandbox/decoding.py``). Not lower: HumanEval/130's plus inputs
    (``tri(1000002)``..., a million numbers each) take many seconds in one program on a loaded machine
    (``pytest -m slow tests/sandbox/test_sandbox_allowlist.py``)."""

    def __post_init__(self) -> None:
        for name in (
            "call_timeout_s",
            "program_timeout_s",
            "memory_mb",
            "max_output_bytes",
            "max_result_bytes",
            "max_decode_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ExecLimits.{name}: expected a positive number, got {value!r}")
        if self.define_timeout_s is not None and self.define_timeout_s <= 0:
            raise ValueError(
                f"ExecLimits.define_timeout_s: expected > 0 or None, got {self.define_timeout_s!r}"
            )

    @property
    def effective_define_timeout_s(self) -> float:
        """Top-level (definition) time limit."""
        return self.call_timeout_s if self.define_timeout_s is None else self.define_timeout_s
