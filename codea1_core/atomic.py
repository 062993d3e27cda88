"""Atomic file and folder writes: the one implementation every layer uses (core, tasks, flows, bench).

What it does: :func:`atomic_path` hands out a fresh temporary file in the target's folder and moves it onto
the target with ``os.replace`` only when the writer finished, so a reader (or a run killed half-way) sees the
old file or the new one, never a torn one; a writer that fails leaves no temporary file behind.
:func:`write_bytes_atomic`, :func:`write_text_atomic` and :func:`write_json_atomic` are the common cases;
``fsync=True`` flushes the data to disk before the rename (checkpoints, where a power cut must not leave an
empty file under the final name). :func:`atomic_dir` and :func:`replace_dir` do the same for folders
(model directories, checkpoints): the folder is built under ``.<name>.tmp`` and swapped in whole. A write that
fails because the disk is full or read-only raises an ``OSError`` naming the path (:func:`disk_error`), whatever
the writer raised. :func:`sha256_file` is the checksum that checks what was written (checkpoint manifests,
fetched releases).

Temporary files are named ``.<name>.<pid>.<random>.tmp`` and created with ``O_EXCL`` and mode ``0o666`` minus
the umask, so two writers of one path (threads of one process included) never share a temp file, and the
final file has the permissions a plain ``open(path, "w")`` would give it.

What it does not: make the folder entry itself durable (no fsync of the directory), or lock against
concurrent writers of the same path (the last ``os.replace`` wins, each version whole).

Run: ``pytest tests/core/test_atomic.py``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _reserve_temp(path: Path) -> Path:
    """Create (``O_EXCL``) an empty temp file beside ``path``; its mode follows the umask like ``open``."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""A disk that cannot take the write: full, over quota, read-only."""


def disk_error(exc: BaseException, folder: str | Path) -> OSError | None:
    """The disk error behind a failed write into ``folder``, as an ``OSError`` naming a path, or None.

    An ``OSError`` with a disk errno in ``exc``'s chain is returned (its path filled in when it had none); any
    other exception — ``torch.save`` on a full disk raises ``RuntimeError("... file write failed")`` — is judged
    by a real write of 64 KiB into ``folder`` (called before the failed write's temp files are removed).
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRNOS:
            return seen if seen.filename else OSError(seen.errno, seen.strerror, str(folder))
        seen = seen.__cause__ or seen.__context__
    probe = Path(folder) / f".disk-probe.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as probe_exc:
        if probe_exc.errno in DISK_ERRNOS:
            return OSError(probe_exc.errno, os.strerror(probe_exc.errno), str(folder))
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temp file path beside ``path``; on a normal exit it replaces ``path``, on an error it is removed.

    For writers that want a file name (``pyarrow.parquet.write_table(table, tmp)``); the temp file exists
    (empty) when the block starts. The parent folder is created when missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _reserve_temp(path)
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        disk = disk_error(exc, path.parent) if isinstance(exc, Exception) else None
        tmp.unlink(missing_ok=True)
        if disk is not None and disk is not exc:
            raise disk from exc  # one line naming the path, whatever the writer raised
        raise


def write_bytes_atomic(path: str | Path, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns ``path``."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> Path:
    """Write ``text`` as UTF-8 (no newline translation) to ``path`` atomically; returns ``path``."""
    return write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_json_atomic(
    path: str | Path,
    data: Any,
    *,
    indent: int | None = 1,
    sort_keys: bool = True,
    default: Callable[[Any], Any] | None = str,
    newline: bool = False,
    fsync: bool = False,
) -> Path:
    r"""``json.dumps(data, indent=, sort_keys=, default=)`` (plus ``"\n"`` with ``newline``) written atomically.

    The defaults are the checkpoint files' format (indent 1, sorted keys, ``str`` for anything else);
    callers whose files were written differently pass their format, so no file changes by a byte.
    """
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=default)
    return write_text_atomic(path, text + ("\n" if newline else ""), fsync=fsync)


def temp_dir_for(path: str | Path) -> Path:
    """The fixed temp folder name of ``path``: ``.<name>.tmp`` beside it (hidden, so globs skip it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def replace_dir(tmp: str | Path, path: str | Path) -> Path:
    """Move the finished folder ``tmp`` onto ``path``; an older ``path`` is moved aside first, removed last.

    ``path`` is never half-written: it holds the old folder or the new one (a kill between the two renames
    leaves no ``path`` and the old folder under ``.<name>.old``).
    """
    tmp, path = Path(tmp), Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.replace(tmp, path)
        return path
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty folder ``.<name>.tmp``; on a normal exit it replaces ``path``, on an error it is removed.

    A leftover temp folder of an earlier, killed write is removed first.
    """
    path = Path(path)
    tmp = temp_dir_for(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException as exc:
        disk = disk_error(exc, tmp) if isinstance(exc, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if disk is not None and disk is not exc:
            raise disk from exc  # one line naming the path, whatever the writer raised
        raise
    replace_dir(tmp, path)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (checkpoint manifests, fetched releases)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
