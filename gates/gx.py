"""One ephemeral Great Expectations context that runs named lists of expectations over a pandas frame.

What it does: :func:`gx_context` creates the context on first use (progress bars off) and returns the same
one afterwards; :meth:`GxContext.run` builds one validation definition per name (a gate and its parameters)
on first use, validates a frame with it and returns the unexpected row positions of every expectation,
keyed by the expectation's reason code. Every thread of the task runner shares the context, under one lock.
What it does not: choose columns or expectations (:mod:`gates.problems`, :mod:`gates.generated_tests`) or
write reports.
Tests: ``pytest tests/gates/test_gx.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pandas as pd


class GxContext:
    """The shared GX context, its pandas data source and the validation definitions built so far."""

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.ctx = gx.get_context(mode="ephemeral")
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.source = self.ctx.data_sources.add_pandas("codea1")
        self.definitions: dict[str, Any] = {}

    def run(
        self, name: str, expectations: list[tuple[str, Any]], frame: pd.DataFrame
    ) -> dict[str, list[int]]:
        """Validate ``frame``; returns ``{code: unexpected row positions}`` for every expectation."""
        with _LOCK:  # one GX context shared by every thread of the task runner
            return self._run(name, expectations, frame)

    def _run(
        self, name: str, expectations: list[tuple[str, Any]], frame: pd.DataFrame
    ) -> dict[str, list[int]]:
        if name not in self.definitions:
            asset = self.source.add_dataframe_asset(name)
            suite = self.ctx.suites.add(self.gx.ExpectationSuite(name=name))
            for _, expectation in expectations:
                suite.add_expectation(expectation)
            batch = asset.add_batch_definition_whole_dataframe(name)
            self.definitions[name] = self.ctx.validation_definitions.add(
                self.gx.ValidationDefinition(name=name, data=batch, suite=suite)
            )
        result = self.definitions[name].run(
            batch_parameters={"dataframe": frame}, result_format={"result_format": "COMPLETE"}
        )
        by_key = {(e.expectation_type, e.column): code for code, e in expectations}  # unique per suite
        out: dict[str, list[int]] = {code: [] for code, _ in expectations}
        for res in result.results:
            if res.exception_info.get("raised_exception"):
                raise RuntimeError(
                    f"GX expectation failed to run: {res.exception_info.get('exception_message')}"
                )
            code = by_key[(res.expectation_config.type, res.expectation_config.kwargs.get("column"))]
            out[code] += list(res.result.get("unexpected_index_list") or [])
        return out


_GX: GxContext | None = None
_LOCK = threading.RLock()


def gx_context() -> GxContext:
    """The process's GX context, created on first use."""
    global _GX
    with _LOCK:
        if _GX is None:
            _GX = GxContext()
    return _GX
