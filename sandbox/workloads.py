"""Sandbox workloads from the offline EvalPlus files: canonical solutions and their inputs as call sources.

What it does: :func:`evalplus_workloads` reads HumanEval+ / MBPP+ (``$CODEA1_DATA_DIR``) and returns, per
task, the program (HumanEval+: ``prompt + canonical_solution``; MBPP+: ``canonical_solution``) and one
call expression ``entry_point(arg, ...)`` per input, each argument written with
``codea1_core.values.to_literal`` (round-trips, incl. nan/inf and huge ints). MBPP+ inputs go through
EvalPlus's own deserialisation (lists -> tuples for the tasks that take tuples) when ``evalplus`` is
installed. Used by the slow sandbox test and ``bench/sandbox_bench.py``.

What it does not do: compute expected values or build ``Problem`` objects (the data layer does that).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from codea1_core.data.evalplus_rules import judged_call
from codea1_core.values import to_literal

FILES = {
    "humanevalplus": "humanevalplus/HumanEvalPlus-v0.1.10.jsonl.gz",
    "mbppplus": "mbppplus/MbppPlus-v0.2.0.jsonl.gz",
}


@dataclass(frozen=True)
class Workload:
    """One program and its call expressions."""

    task_id: str
    program: str
    calls: list[str]


def evalplus_workloads(
    data_dir: str | Path, benchmark: str, inputs: tuple[str, ...] = ("base_input",), max_tasks: int = 0
) -> list[Workload]:
    """Load ``benchmark`` (``humanevalplus`` or ``mbppplus``) as sandbox workloads.

    Args:
        data_dir: the offline data folder (with ``humanevalplus/`` and ``mbppplus/``).
        benchmark: which file.
        inputs: input fields to turn into calls, in order (``base_input``, ``plus_input``).
        max_tasks: keep only the first this many tasks (0 = all).

    Raises:
        FileNotFoundError: the file is missing (the message names it).
        ValueError: unknown benchmark or input field, or a malformed row (names file and row).
    """
    if benchmark not in FILES:
        raise ValueError(f"benchmark: expected one of {sorted(FILES)}, got {benchmark!r}")
    path = Path(data_dir) / FILES[benchmark]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: EvalPlus file not found (set CODEA1_DATA_DIR)")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for row_no, line in enumerate(fh, start=1):
            if max_tasks and len(out) >= max_tasks:
                break
            try:
                row = json.loads(line)
                out.append(_workload(row, benchmark, inputs))
            except (KeyError, TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path}: row {row_no}: malformed ({type(exc).__name__}: {exc})") from None
    return out


def _workload(row: dict, benchmark: str, inputs: tuple[str, ...]) -> Workload:
    program = (
        row["prompt"] + row["canonical_solution"]
        if benchmark == "humanevalplus"
        else row["canonical_solution"]
    )
    calls = []
    for field in inputs:
        if field not in ("base_input", "plus_input"):
            raise ValueError(f"inputs: expected base_input or plus_input, got {field!r}")
        args_list = row[field]
        if not args_list:  # MBPP+ v0.2.0 stores Mbpp/793's empty plus_input as {}
            continue
        if not isinstance(args_list, list):
            raise TypeError(f"{field} of {row['task_id']} is {type(args_list).__name__}, expected a list")
        if benchmark == "mbppplus":
            args_list = _mbpp_deserialize(row["task_id"], args_list)
        calls += [  # MBPP_OUTPUT_NOT_NONE tasks: EvalPlus' ``out is not None`` rule, as the loader applies it
            judged_call(
                benchmark,
                row["entry_point"],
                f"{row['entry_point']}({', '.join(to_literal(a) for a in args)})",
            )
            for args in args_list
        ]
    return Workload(row["task_id"], program, calls)


def _mbpp_deserialize(task_id: str, args_list: list) -> list:
    try:
        from evalplus.data.mbpp import mbpp_deserialize_inputs
    except ImportError:  # evalplus is a dev dependency; without it inputs stay as JSON gives them
        return args_list
    return mbpp_deserialize_inputs(task_id, args_list)
