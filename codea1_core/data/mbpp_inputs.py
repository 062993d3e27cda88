"""MBPP+ input restoration: the tuples, sets and complex numbers that JSON turned into lists/strings.

What it does: :func:`mbpp_deserialize_inputs` applies, per MBPP+ task number, the same fix as EvalPlus'
``mbpp_deserialize_inputs`` (derived from EvalPlus, Apache-2.0) to each argument list of ``base_input`` /
``plus_input``; tasks without a fix are returned unchanged.

What it does not: read files or check values beyond the restoration (a malformed input is a
:class:`~codea1_core.data.dataset_types.DatasetError`). How to run: ``mbpp_deserialize_inputs("Mbpp/2",
inputs)``, called by ``codea1_core.data.datasets.load_evalplus``; tests in ``tests/core/data/test_datasets.py``
(``test_evalplus_mbpp_restores_tuples_and_builds_def_prompt``, ``test_shared_data_counts``).
"""

from __future__ import annotations

from typing import Any

from codea1_core.data.dataset_types import DatasetError

# --------------------------------------------------------------------------------------------------
# MBPP+ input restoration (EvalPlus ``mbpp_deserialize_inputs``, Apache-2.0): JSON lost tuples/sets
# --------------------------------------------------------------------------------------------------

_T = tuple
_MBPP_PLUS_FIX = {
    **dict.fromkeys(
        (
            2,
            116,
            132,
            143,
            222,
            261,
            273,
            394,
            399,
            421,
            424,
            429,
            470,
            560,
            579,
            596,
            616,
            630,
            726,
            740,
            744,
            809,
        ),
        lambda inp: [_T(x) for x in inp],
    ),
    **dict.fromkeys(
        (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780),
        lambda inp: [[_T(x) for x in xs] for xs in inp],
    ),
    **dict.fromkeys((75, 413, 444, 753), lambda inp: [[_T(x) for x in inp[0]], inp[1]]),
    **dict.fromkeys((106, 750), lambda inp: [inp[0], _T(inp[1])]),
    115: lambda inp: [[set(x) if isinstance(x, list) and x else {} for x in inp[0]]],
    124: lambda inp: [float(inp[0]), complex(inp[1])],
    **dict.fromkeys((250, 405, 446, 617, 720, 763, 808), lambda inp: [_T(inp[0]), *inp[1:]]),
    **dict.fromkeys((259, 401, 445), lambda inp: [_T(_T(x) for x in xs) for xs in inp]),
    278: lambda inp: [_T(_T(x) if isinstance(x, list) else x for x in inp[0])],
    307: lambda inp: [_T(inp[0]), inp[1], inp[2]],
    722: lambda inp: [{k: _T(v) for k, v in inp[0].items()}, *inp[1:]],
    252: lambda inp: [complex(inp[0])],
    **dict.fromkeys((580, 615, 791), lambda inp: _deep_tuple(inp)),
}


def _deep_tuple(value: Any) -> Any:
    return _T(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def mbpp_deserialize_inputs(task_id: str, inputs: list) -> list:
    """Restore the tuples, sets and complex numbers that JSON turned into lists/strings (as EvalPlus)."""
    fix = _MBPP_PLUS_FIX.get(int(str(task_id).split("/")[-1]))
    if fix is None:
        return inputs
    try:
        return [fix(inp) for inp in inputs]
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise DatasetError(f"MBPP+ {task_id}: cannot restore input types: {exc}") from None
