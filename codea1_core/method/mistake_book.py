"""The Mistake Book: historical failing tests replayed against later code (docs/method.md §8, D6).

What: :class:`MistakeBook` is plain state plus pure operations.
  * Entries are canonical (call source, expected value) pairs with a frequency, ``first_seen`` and
    ``last_seen`` iteration (last_seen = last iteration the entry was inserted or incremented, §18.2).
    Two tests are the same entry when their ast-normalized call sources are equal and
    ``values.encode(expected)`` gives the same bytes once set elements and dict items are put in a
    canonical order (:func:`canonical_value_bytes`; D1, D6). So ``1`` and ``1.0`` stay different tests.
  * :meth:`MistakeBook.retrieve` — top-k by frequency. ``tie_break="recent"`` (ours): ties go to the
    entry last seen most recently. ``tie_break="official"``: the stored list of the problem is sorted
    stably **in place** by frequency, so ties follow the previous retrieval's ranking with entries added
    since then behind them (§8; this retrieval therefore changes state).
  * :meth:`MistakeBook.update` — the official rule (§8): first −1 for every replayed test a valid code
    passed (delete at ≤ 0), then +1 for every failing valid generated test (insert at 1 when absent),
    duplicates counted; then the optional per-problem cap evicts lowest frequency, then oldest (D6).
  * :meth:`MistakeBook.to_dict` / :meth:`MistakeBook.from_dict` — a versioned JSON-safe schema.

What not: no file I/O (``tasks/mistake_book.py`` persists the dict atomically each iteration), no
execution, no knowledge of codes or suites — the caller passes the flattened ``failed`` / ``passed``
lists of one problem, counting valid codes only. A replayed test that fails is *not* passed in
``failed`` (official: it is not incremented).

How to run: ``python -m pytest tests/core/method/test_mistake_book.py -q``.
"""

from __future__ import annotations

import ast
import base64
import functools
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

from codea1_core import values
from codea1_core.method.validity import OK, replay_reason
from codea1_core.types import TestCase

SCHEMA = "codea1.mistake_book/1"
"""Version tag of :meth:`MistakeBook.to_dict`; :meth:`MistakeBook.from_dict` rejects any other."""

TieBreak = Literal["recent", "official"]


@dataclass
class Entry:
    """One stored test of one problem (mutable: frequencies and recency change in place)."""

    call: str
    """ast-normalized call source, e.g. ``f(1, [2, 3])``."""
    expected: Any
    """Reference output of the call (a plain value ``values.encode`` accepts)."""
    expected_bytes: bytes
    """``values.encode(expected)`` (what :meth:`MistakeBook.to_dict` stores)."""
    value_key: bytes
    """:func:`canonical_value_bytes` of ``expected``: the value half of the entry's identity."""
    frequency: int
    first_seen: int
    last_seen: int

    @property
    def key(self) -> tuple[str, bytes]:
        """Identity: canonical call + order-independent encoding of the expected value."""
        return (self.call, self.value_key)


@functools.lru_cache(maxsize=1 << 15)  # a step's update sees each failing test once per code and suite
def canonical_call(call: str) -> str:
    """The ast-normalized source of a call expression (whitespace, quotes and parentheses unified).

    The call must satisfy the test-validity rule for replayed calls
    (:func:`codea1_core.method.validity.replay_reason`): a replayed call never binds a name of the program.

    Raises:
        ValueError: ``call`` is not a Python expression, or the rule refuses it.
    """
    try:
        tree = ast.parse(call.strip(), mode="eval")
        code = replay_reason(ast.parse(unicodedata.normalize("NFKC", call.strip()), mode="eval"))
    except SyntaxError as exc:
        raise ValueError(f"mistake book: call is not a Python expression: {call!r} ({exc.msg})") from None
    if code != OK:
        raise ValueError(
            f"mistake book: call {call!r} is refused ({code}): a replayed call may not bind names"
        )
    return ast.unparse(tree)  # names as written: NFKC only decides the rule, as the parser does


def canonical_value_bytes(value: Any) -> bytes:
    """``values.encode`` with set elements and dict items in sorted order, for entry identity.

    Equal sets/dicts built in different orders (or decoded in another process, where string hashes
    differ) must be one entry; ``values.encode`` keeps iteration order, so containers are re-assembled
    here from their members' encodings (each is self-delimiting, so the result stays unambiguous).

    Raises:
        values.UnsupportedValue: ``value`` is not plain data.
    """
    kind = type(value)
    if kind in (set, frozenset, dict, list, tuple):
        if kind is dict:
            parts = sorted(canonical_value_bytes(k) + canonical_value_bytes(v) for k, v in value.items())
        else:
            parts = [canonical_value_bytes(v) for v in value]
            if kind in (set, frozenset):
                parts.sort()
        tags: dict[type, bytes] = {set: b"S", frozenset: b"Z", dict: b"d", list: b"l", tuple: b"t"}
        tag = tags[kind]
        return tag + len(parts).to_bytes(4, "big") + b"".join(parts)
    return values.encode(value)


class MistakeBook:
    """Per-problem store of failing tests with frequencies (§8, D6). See the module docstring.

    Args:
        top_k: Default number of tests :meth:`retrieve` returns (``mistake_book.top_k``).
        tie_break: ``recent`` (ours) or ``official`` (§8 in-place stable sort).
        max_per_problem: Entries kept per problem after an update; 0 = unbounded (official).
        enabled: False makes the book inert (the no-Mistake-Book ablation, D10): nothing is
            retrieved and updates change nothing.
    """

    def __init__(
        self, top_k: int = 8, tie_break: TieBreak = "recent", max_per_problem: int = 64, enabled: bool = True
    ) -> None:
        if tie_break not in ("recent", "official"):
            raise ValueError(f"mistake_book.tie_break: expected 'recent' or 'official', got {tie_break!r}")
        if top_k < 0 or max_per_problem < 0:
            raise ValueError(
                f"mistake_book: top_k ({top_k}) and max_per_problem ({max_per_problem}) must be >= 0"
            )
        self.top_k = top_k
        self.tie_break: TieBreak = tie_break
        self.max_per_problem = max_per_problem
        self.enabled = enabled
        self._problems: dict[str, list[Entry]] = {}
        """Stored order per problem: insertion order, re-sorted in place by official retrievals."""

    @classmethod
    def from_config(cls, cfg: Any) -> MistakeBook:
        """An empty book configured by a ``MistakeBookConfig`` (``cfg.mistake_book``)."""
        return cls(cfg.top_k, cfg.tie_break, cfg.max_per_problem, cfg.enabled)

    # ---------------------------------------------------------------------------------------------
    # Queries
    # ---------------------------------------------------------------------------------------------

    def entries(self, problem_id: str) -> list[Entry]:
        """The stored entries of a problem in stored order (a copy of the list, not of the entries)."""
        return list(self._problems.get(problem_id, []))

    def problems(self) -> list[str]:
        """Problem ids with at least one entry, sorted."""
        return sorted(self._problems)

    def size(self, problem_id: str | None = None) -> int:
        """Number of entries of one problem, or of the whole book."""
        if problem_id is not None:
            return len(self._problems.get(problem_id, []))
        return sum(len(v) for v in self._problems.values())

    def stats(self) -> dict[str, float]:
        """Summary for logging: problems, entries, total/max/mean frequency."""
        freqs = [e.frequency for entries in self._problems.values() for e in entries]
        return {
            "problems": float(len(self._problems)),
            "entries": float(len(freqs)),
            "frequency_total": float(sum(freqs)),
            "frequency_max": float(max(freqs, default=0)),
            "frequency_mean": sum(freqs) / len(freqs) if freqs else 0.0,
        }

    def retrieve(self, problem_id: str, k: int | None = None) -> list[TestCase]:
        """Top-``k`` tests of a problem by frequency (§8; default ``k`` = ``top_k``).

        ``recent``: ties by most recent ``last_seen``, then most recent ``first_seen``, then stored order.
        ``official``: stable in-place sort of the stored list by frequency (mutates the stored order).
        """
        k = self.top_k if k is None else k
        entries = self._problems.get(problem_id)
        if not self.enabled or not entries or k <= 0:
            return []
        if self.tie_break == "official":
            entries.sort(key=lambda e: -e.frequency)  # list.sort is stable: ties keep the stored order
            ranked = entries
        else:
            ranked = sorted(entries, key=lambda e: (-e.frequency, -e.last_seen, -e.first_seen))
        return [TestCase(call=e.call, expected=e.expected) for e in ranked[:k]]

    # ---------------------------------------------------------------------------------------------
    # Update
    # ---------------------------------------------------------------------------------------------

    def _entry_key(self, problem_id: str, test: TestCase) -> tuple[str, bytes]:
        call = canonical_call(test.call)
        try:
            return (call, canonical_value_bytes(test.expected))
        except values.UnsupportedValue as exc:
            raise ValueError(
                f"mistake book: problem {problem_id!r}, call {call!r}: expected value cannot be stored ({exc})"
            ) from None

    def update(
        self, problem_id: str, failed: list[TestCase], passed: list[TestCase], iteration: int
    ) -> dict[str, int]:
        """Apply one iteration's outcomes of one problem (§8 official rule, D6 cap).

        Args:
            problem_id: The problem (``Problem.id``).
            failed: Every failing valid generated test over all valid codes and suites, duplicates
                included (+1 each; inserted at 1 when absent).
            passed: Every replayed test passed by a valid code, duplicates included (−1 each when in
                the book; deleted at ≤ 0). Applied before ``failed``.
            iteration: The training step, stored as first_seen/last_seen.

        Returns:
            Counts ``added`` (new entries), ``incremented``, ``decremented``, ``removed`` (reached 0),
            ``evicted`` (by the cap) and ``size`` (entries of the problem afterwards).
        """
        counts = dict.fromkeys(("added", "incremented", "decremented", "removed", "evicted"), 0)
        if not self.enabled:
            return {**counts, "size": self.size(problem_id)}
        entries = self._problems.setdefault(problem_id, [])
        index = {e.key: e for e in entries}
        for test in passed:
            entry = index.get(self._entry_key(problem_id, test))
            if entry is None:
                continue
            entry.frequency -= 1
            counts["decremented"] += 1
            if entry.frequency <= 0:
                del index[entry.key]
                counts["removed"] += 1
        entries[:] = [e for e in entries if e.key in index]  # survivors keep their stored order
        for test in failed:
            key = self._entry_key(problem_id, test)
            entry = index.get(key)
            if entry is None:
                entry = Entry(
                    key[0], test.expected, values.encode(test.expected), key[1], 1, iteration, iteration
                )
                index[key] = entry
                entries.append(entry)  # new entries go behind the existing ones (§8)
                counts["added"] += 1
            else:
                entry.frequency += 1
                entry.last_seen = iteration
                counts["incremented"] += 1
        counts["evicted"] = self._enforce_cap(entries)
        if not entries:
            del self._problems[problem_id]
        return {**counts, "size": len(entries)}

    def _enforce_cap(self, entries: list[Entry]) -> int:
        """Evict lowest frequency, then least recently seen, then earliest inserted, down to the cap (D6)."""
        excess = len(entries) - self.max_per_problem
        if self.max_per_problem == 0 or excess <= 0:
            return 0
        position = {id(e): i for i, e in enumerate(entries)}
        victims = sorted(entries, key=lambda e: (e.frequency, e.last_seen, e.first_seen, position[id(e)]))
        doomed = {id(e) for e in victims[:excess]}
        entries[:] = [e for e in entries if id(e) not in doomed]
        return excess

    # ---------------------------------------------------------------------------------------------
    # Serialization
    # ---------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: ``{"schema": SCHEMA, "problems": {id: [entry, ...]}}``.

        Problems are sorted by id; entries stay in stored order so the official tie-break state
        round-trips. ``expected`` is base64 of ``values.encode`` (exact, type-preserving).
        """
        return {
            "schema": SCHEMA,
            "problems": {
                pid: [
                    {
                        "call": e.call,
                        "expected": base64.b64encode(e.expected_bytes).decode("ascii"),
                        "frequency": e.frequency,
                        "first_seen": e.first_seen,
                        "last_seen": e.last_seen,
                    }
                    for e in self._problems[pid]
                ]
                for pid in sorted(self._problems)
            },
        }

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        top_k: int = 8,
        tie_break: TieBreak = "recent",
        max_per_problem: int = 64,
        enabled: bool = True,
    ) -> MistakeBook:
        """Rebuild a book from :meth:`to_dict` output; settings as in the constructor.

        Raises:
            ValueError: Unknown schema version or a malformed entry (the message names problem and row).
        """
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"mistake book: unsupported schema {found!r} (this version reads {SCHEMA!r})")
        problems = data.get("problems")
        if not isinstance(problems, dict):
            raise ValueError("mistake book: 'problems' must be a mapping of problem id to entry list")
        book = cls(top_k, tie_break, max_per_problem, enabled)
        for pid, rows in problems.items():
            if not isinstance(rows, list):
                raise ValueError(f"mistake book: problems[{pid!r}] must be a list of entries")
            entries = [_entry_from_row(pid, i, row) for i, row in enumerate(rows)]
            if len({e.key for e in entries}) != len(entries):
                raise ValueError(f"mistake book: problems[{pid!r}] holds duplicate entries")
            if entries:
                book._problems[pid] = entries
        return book


def _entry_from_row(pid: str, i: int, row: Any) -> Entry:
    where = f"mistake book: problems[{pid!r}][{i}]"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    missing = {"call", "expected", "frequency", "first_seen", "last_seen"} - set(row)
    if missing:
        raise ValueError(f"{where}: missing keys {sorted(missing)}")
    for name in ("frequency", "first_seen", "last_seen"):
        if isinstance(row[name], bool) or not isinstance(row[name], int):
            raise ValueError(f"{where}.{name}: expected int, got {row[name]!r}")
    if row["frequency"] < 1:
        raise ValueError(f"{where}.frequency: must be >= 1, got {row['frequency']}")
    if not isinstance(row["call"], str) or not isinstance(row["expected"], str):
        raise ValueError(f"{where}: 'call' and 'expected' must be strings")
    try:
        raw = base64.b64decode(row["expected"].encode("ascii"), validate=True)
        expected = values.decode(raw)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed file
        raise ValueError(f"{where}.expected: cannot decode value ({type(exc).__name__}: {exc})") from None
    try:
        call = canonical_call(row["call"])
    except ValueError as exc:
        raise ValueError(f"{where}.call: {exc}") from None
    return Entry(
        call,
        expected,
        raw,  # kept as read, so a load/save round trip is byte-identical (set order is hash-dependent)
        canonical_value_bytes(expected),
        row["frequency"],
        row["first_seen"],
        row["last_seen"],
    )


def starting_book(cfg: Any, saved: dict[str, Any] | None) -> MistakeBook | None:
    """The Mistake Book a training run starts with (§8): None in ``golden`` mode or with
    ``mistake_book.enabled: false``; the checkpoint's book (``saved``) on resume; else an empty one."""
    mb = cfg.mistake_book
    if not mb.enabled or cfg.mode == "golden":
        return None
    if saved:
        return MistakeBook.from_dict(saved, mb.top_k, mb.tie_break, mb.max_per_problem, mb.enabled)
    return MistakeBook.from_config(mb)
