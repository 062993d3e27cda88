"""Types shared by the dataset modules: the dataset errors and the :class:`Pending` expected-value marker.

What it does: defines :class:`DatasetError` (bad input data, the message names the file and the line,
row or key), :class:`SourceUnavailable` (a source whose files are absent: ``prepare`` skips it) and
:class:`Pending` / :data:`PENDING` / :func:`is_pending`, the marker of a golden test whose expected value
is still to be computed by running the reference (docs/method.md D1), with what the dataset claims.

What it does not: read, parse or run anything. It is the bottom of the dataset modules:
``source_text``, ``mbpp_inputs``, ``datasets`` and ``prepared`` import it; it imports none of them.
How to run: nothing to run; its tests are in ``tests/core/data/test_datasets.py``
(``pytest tests/core/data/test_datasets.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class DatasetError(ValueError):
    """Bad input data: the message names the file and the line, row or key."""


class SourceUnavailable(DatasetError):
    """A source whose files are absent (or hub unreachable): ``prepare`` skips it and reports why."""


@dataclass(frozen=True)
class Pending:
    """Expected value still to be computed by running the reference on the call (D1).

    ``answer``: the dataset's expected-value expression (``assert CALL == ANSWER``); ``check``: the
    dataset's whole assert expression, which must be true on the reference. Both empty: no claim.
    """

    answer: str = ""
    check: str = ""


PENDING = Pending()


def is_pending(value: Any) -> bool:
    """True for a :class:`Pending` marker (an expected value not yet filled)."""
    return isinstance(value, Pending)
