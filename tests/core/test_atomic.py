"""The one atomic write (``codea1_core/atomic.py``) and the callers that rely on it.

Regression tests name their bug, each from a private copy of the write: ``save_prepared``/the GX
report/prepare's cache wrote 0600 files (``mkstemp``), the checkpoint writes left their temp file behind
when the writer failed and shared one temp name per process, and a failed ``save_checkpoint`` left its
half-written ``.it_NNNNNN.tmp`` folder.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from codea1_core.atomic import (
    atomic_dir,
    atomic_path,
    replace_dir,
    sha256_file,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


def _umask_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_replace_the_target_and_leave_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.txt"
    write_text_atomic(target, "één\n")
    assert target.read_bytes() == "één\n".encode()
    write_bytes_atomic(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in target.parent.iterdir()] == ["a.txt"]
    assert _mode(target) == _umask_mode()


def test_json_format_is_the_callers_own(tmp_path: Path) -> None:
    """Defaults = the checkpoint files' format; every other caller's format is reachable byte for byte."""
    data = {"b": 1, "a": [1.5, None], "p": Path("x")}
    write_json_atomic(tmp_path / "c.json", data, fsync=True)
    assert (tmp_path / "c.json").read_text() == json.dumps(data, indent=1, sort_keys=True, default=str)
    write_json_atomic(tmp_path / "h.json", {"b": 1, "a": 2}, sort_keys=False, newline=True)
    assert (tmp_path / "h.json").read_text() == '{\n "b": 1,\n "a": 2\n}\n'
    with pytest.raises(TypeError):  # default=None: unserialisable data is an error, as json.dumps says
        write_json_atomic(tmp_path / "w.json", {"p": Path("x")}, indent=2, default=None)


def test_failed_writer_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "t.parquet"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_regression_checkpoint_json_write_failure_leaves_no_temp_file(tmp_path: Path) -> None:
    """Bug: the checkpoint's ``write_json_atomic`` streamed into ``.<name>.tmp.<pid>`` and left it on an error."""
    from workspace import checkpoints

    circular: list = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular"):
        checkpoints.write_json_atomic(tmp_path / "state.json", {"x": circular})
    assert list(tmp_path.iterdir()) == []


def test_regression_one_process_two_threads_same_path(tmp_path: Path) -> None:
    """Bug: the temp name was ``.<name>.tmp.<pid>``: two threads writing one file shared it (a torn write or a
    ``FileNotFoundError`` from the loser's ``os.replace``). Every version written must arrive whole."""
    from workspace import checkpoints

    target, errors = tmp_path / "LATEST", []
    texts = {"a": "a" * 200_000, "b": "b" * 200_000}

    def writer(text: str) -> None:
        try:
            for _ in range(150):
                checkpoints.write_text_atomic(target, text)
        except Exception as exc:  # collected: an exception in a thread would not fail the test
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in texts.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_text() in texts.values()
    assert [p.name for p in tmp_path.iterdir()] == ["LATEST"]


def test_regression_prepared_parquet_gets_the_normal_file_mode(tmp_path: Path) -> None:
    """Bug: ``save_prepared`` wrote through ``mkstemp``, so ``data/prepared/*.parquet`` were 0600 (owner only)."""
    from codea1_core.data.prepared import save_prepared
    from codea1_core.types import Problem, TestCase

    problem = Problem(
        id="t/1",
        source="mbpp",
        split="train",
        prompt="def f(x):\n",
        description="d",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=(TestCase("f(1)", 1),),
    )
    path = save_prepared([problem], tmp_path / "train.parquet")
    assert _mode(path) == _umask_mode()


def test_regression_failed_checkpoint_leaves_no_partial_folder(tmp_path: Path) -> None:
    """Bug: a ``save_checkpoint`` that failed mid-way left ``.it_NNNNNN.tmp`` (a policy's weights, GBs on a
    real model) until the next save; the previous checkpoint must stay the only one."""
    from workspace import checkpoints, resume

    class Policy:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def save(self, path: Path) -> Path:
            path.mkdir(parents=True)
            (path / "weights.bin").write_bytes(b"w" * 1000)
            if self.fail:
                raise OSError(28, "No space left on device")
            return path

    resume.save_run_info(tmp_path, "fp")
    checkpoints.save_checkpoint(tmp_path, 1, {"code": Policy(False)}, None, {"fingerprint": "fp"})
    with pytest.raises(OSError, match="No space"):
        checkpoints.save_checkpoint(tmp_path, 2, {"code": Policy(True)}, None, {"fingerprint": "fp"})
    root = checkpoints.ckpt_root(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "it_000001", "run.json"]
    assert resume.resume_or_start(tmp_path, "auto", "fp")["iteration"] == 1


def test_atomic_dir_swaps_whole_folders_and_keeps_the_old_one_on_error(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        assert tmp.name == ".model.tmp" and tmp.is_dir()
        (tmp / "v").write_text("1")
    with pytest.raises(KeyError), atomic_dir(target) as tmp:
        (tmp / "v").write_text("2")
        raise KeyError("killed")
    assert (target / "v").read_text() == "1"
    with atomic_dir(target) as tmp:
        (tmp / "w").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["w"]  # replaced, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_replace_dir_onto_a_missing_target_creates_the_parent(tmp_path: Path) -> None:
    src = tmp_path / "built"
    src.mkdir()
    (src / "f").write_text("x")
    assert replace_dir(src, tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b" / "f").read_text() == "x" and not src.exists()


def test_no_other_module_implements_an_atomic_write(repo_root: Path) -> None:
    """One atomic write (bug guarded: the temp-file-then-rename write existed ten times): only
    ``codea1_core/atomic.py`` may rename into place (``workspace/resume.py`` moves the checkpoints of a changed
    config aside to ``checkpoints.previous``, which is not a write)."""
    allowed = {"codea1_core/atomic.py": 4, "workspace/resume.py": 1}
    found = {}
    for folder in ("codea1_core", "tracking", "workspace", "gates", "tasks", "flows", "tools", "bench"):
        for path in sorted((repo_root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            n = sum(text.count(s) for s in ("os.replace(", ".rename(", "mkstemp(", "NamedTemporaryFile("))
            rel = str(path.relative_to(repo_root))
            if n and rel != "flows/prefect_server.py":  # its mkstemp is a log file, never renamed
                found[rel] = n
    assert found == allowed


def test_sha256_file_is_the_checksum_of_the_bytes_read_in_chunks(tmp_path: Path) -> None:
    import hashlib

    data = bytes(range(256)) * 9000  # > 1 MiB: more than one chunk
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
