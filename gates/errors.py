"""The error a data-quality gate raises: a message, the JSON report's path and the offending ids.

What it does not: run a gate (:mod:`gates.problems`, :mod:`gates.generated_tests`).
Tests: ``pytest tests/gates``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class DataQualityError(Exception):
    """A data-quality gate failed; ``report_path`` (when set) holds the full JSON report."""

    def __init__(self, message: str, report_path: Path | None = None, ids: Iterable[str] = ()):
        super().__init__(message if report_path is None else f"{message} (report: {report_path})")
        self.report_path = report_path
        self.ids = list(ids)
