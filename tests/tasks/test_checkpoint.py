"""The checkpoint task: the Mistake Book in a checkpoint is the merge task's file, byte for byte.

Before: every step serialised the book twice (the merge task's DVC out, then ``to_dict`` again for the
checkpoint); the checkpoint now copies the file the merge wrote, and its bytes are what the second
serialisation wrote (indent 1, sorted keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from codea1_core.config import Config
from codea1_core.method.mistake_book import MistakeBook
from codea1_core.types import TestCase
from tasks.checkpoint import checkpoint
from tasks.mistake_book import merge_mistake_book


@dataclass
class _Matrix:  # the two lists the book's update reads (§8), as OutcomeMatrix exposes them
    problem_id: str
    failed: list

    def failed_tests(self) -> list:
        return self.failed

    def passed_replay(self) -> list:
        return []


def test_the_checkpoint_holds_the_book_the_merge_task_wrote_byte_for_byte(tmp_path: Path) -> None:
    book = MistakeBook.from_config(Config().mistake_book)
    out = tmp_path / "mistake_book.json"
    merge_mistake_book.fn(book, [_Matrix("p", [TestCase("f(1)", 2), TestCase("f(2)", [3, "x"])])], 1, out)
    folder = Path(checkpoint.fn(str(tmp_path), 1, {}, str(out), {"fingerprint": "fp"}))
    saved = (folder / "mistake_book.json").read_bytes()
    assert saved == out.read_bytes()
    assert saved == json.dumps(book.to_dict(), indent=1, sort_keys=True, default=str).encode()
    assert MistakeBook.from_dict(json.loads(saved)).size() == 2
    assert not (
        Path(checkpoint.fn(str(tmp_path), 2, {}, None, {"fingerprint": "fp"})) / "mistake_book.json"
    ).exists()
