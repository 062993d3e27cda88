"""Atomic per-iteration checkpoints and resume (docs/method.md §3 step 16; our resume rule: every iteration).

What it does: after every iteration writes ``<checkpoint_dir>/checkpoints/it_NNNNNN/`` holding both policies
(``Policy.save``: weights/adapters, optimizer, scheduler, RNG), the Mistake Book JSON, ``state.json``
(iteration = data cursor, config fingerprint, MLflow run id, metrics history, Python RNG) and ``rng.pt``
(torch RNG). The directory is built under a temporary name and renamed with ``os.replace``; then the ``LATEST``
pointer file is replaced atomically. A kill at any moment leaves either the previous or the new iteration
complete, never a half-written one. Older iterations beyond ``keep_checkpoints`` are deleted afterwards.
The last file written into a checkpoint is ``MANIFEST.json`` (size and sha256 of every other file, atomic);
on resume :func:`select_checkpoint` verifies it and falls back to the newest intact checkpoint with one warning
line naming what was wrong (truncated weights, zeroed bytes, empty ``rng.pt``...); when none is intact it
raises :class:`CheckpointError` naming the file. :class:`WorkspaceLock` keeps one training run per workspace
(``<checkpoint_dir>/train.lock``: pid, host, start time; a lock whose process is gone is stale and taken over).
What it does not: decide when to checkpoint (the train flow does) or log to MLflow.

Run: used by ``flows/train.py``; tested by ``tests/tasks/test_checkpoint.py``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import atomic_dir, sha256_file, write_json_atomic, write_text_atomic

STATE_SCHEMA = "codea1.train_state/1"
MANIFEST = "MANIFEST.json"
MANIFEST_SCHEMA = "codea1.checkpoint_manifest/1"
LOCK_NAME = "train.lock"
log = logging.getLogger("codea1.checkpoint")


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from; the message names the corrupt file and what to do."""


class WorkspaceLockedError(RuntimeError):
    """Another training run holds the workspace; the message names its pid and start time."""


def ckpt_root(checkpoint_dir: str | Path) -> Path:
    """Folder holding the iteration checkpoints and the LATEST pointer."""
    return Path(checkpoint_dir) / "checkpoints"


def save_checkpoint(
    checkpoint_dir: str | Path,
    iteration: int,
    policies: dict[str, Any],
    book: dict[str, Any] | None,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write iteration ``iteration`` atomically and move ``LATEST`` to it; returns its folder."""
    import torch

    root = ckpt_root(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"it_{iteration:06d}"  # built as .it_NNNNNN.tmp; replaces a re-run iteration's folder
    with atomic_dir(final) as tmp:
        for role, policy in policies.items():
            policy.save(tmp / role)
        if book is not None:
            write_json_atomic(tmp / "mistake_book.json", book, fsync=True)
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        full_state = dict(state, schema=STATE_SCHEMA, iteration=iteration, python_rng=_py_rng_state())
        write_json_atomic(tmp / "state.json", full_state, fsync=True)
        write_manifest(tmp)  # last: a checkpoint without a matching manifest is never trusted
    write_text_atomic(root / "LATEST", final.name)
    _prune(root, keep, final.name)
    return final


def _py_rng_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _prune(root: Path, keep: int, current: str) -> None:
    done = sorted(p for p in root.glob("it_*") if p.is_dir())
    for old in done[: max(0, len(done) - max(keep, 1))]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)
    for stale in [*root.glob(".it_*.tmp"), *root.glob(".it_*.old")]:  # left by a kill mid-write / mid-swap
        shutil.rmtree(stale, ignore_errors=True)


def write_manifest(folder: Path) -> None:
    """``MANIFEST.json``: size and sha256 of every file below ``folder`` (written atomically, last)."""
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    write_json_atomic(folder / MANIFEST, {"schema": MANIFEST_SCHEMA, "files": files}, fsync=True)


_VERIFIED: dict[str, int] = {}  # folder -> manifest mtime_ns: verified once per process (hashing is I/O)


def verify_checkpoint(folder: Path) -> str | None:
    """Why ``folder`` is not an intact checkpoint (naming the file), or None when every file matches."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"{manifest}: missing (an interrupted write or a checkpoint from before manifests)"
    if _VERIFIED.get(str(folder)) == manifest.stat().st_mtime_ns:
        return None
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        sizes = {rel: int(meta["size"]) for rel, meta in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{manifest}: unreadable ({type(exc).__name__})"
    for rel, size in sizes.items():  # sizes first: a truncated file is found without hashing
        path = folder / rel
        if not path.is_file():
            return f"{path}: missing"
        if path.stat().st_size != size:
            return f"{path}: {path.stat().st_size} bytes, the manifest says {size} (truncated or overwritten)"
    for rel, meta in files.items():
        if sha256_file(folder / rel) != meta["sha256"]:
            return f"{folder / rel}: sha256 differs from the manifest (corrupted bytes)"
    _VERIFIED[str(folder)] = manifest.stat().st_mtime_ns
    return None


def _candidates(root: Path) -> tuple[list[Path], list[str]]:
    """Checkpoints to try, newest first: ``LATEST``'s target, then older ones; problems with the pointer."""
    pointer = root / "LATEST"
    dirs = sorted((p for p in root.glob("it_*") if p.is_dir()), reverse=True)
    if not pointer.is_file():
        return dirs, []
    name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    target = root / name
    if not (name.startswith("it_") and target.is_dir()):
        return dirs, [f"{pointer}: points to {name!r}, which does not exist"]
    return [target] + [d for d in dirs if d.name < name], []


def select_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest intact checkpoint (verified against its manifest), or None when there is none at all.

    A corrupt newer one is deleted after one warning line naming what was wrong, and ``LATEST`` is moved to
    the checkpoint resumed from. Raises :class:`CheckpointError` when checkpoints exist but none is intact.
    """
    root = ckpt_root(checkpoint_dir)
    candidates, problems = _candidates(root)
    bad: list[Path] = []
    for folder in candidates:
        reason = verify_checkpoint(folder)
        if reason is None:
            if problems:
                log.warning("checkpoint: %s; resuming from %s instead", "; ".join(problems), folder.name)
                for old in bad:
                    shutil.rmtree(old, ignore_errors=True)
                write_text_atomic(root / "LATEST", folder.name)
            return folder
        problems.append(f"{folder.name} is corrupt: {reason}")
        bad.append(folder)
    if problems:
        raise CheckpointError(
            f"no intact checkpoint in {root}: {problems[0]}; delete {root} "
            "(or set orchestration.resume=never) to start over"
        )
    return None


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest intact iteration's folder (:func:`select_checkpoint`), or None when there is none."""
    return select_checkpoint(checkpoint_dir)


def load_state(path: str | Path, restore_rng: bool = True) -> dict[str, Any]:
    """Read ``state.json`` (+ ``mistake_book.json`` as ``state['book']``) and restore the RNGs."""
    import torch

    path = Path(path)
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if state.get("schema") != STATE_SCHEMA:
        raise RuntimeError(
            f"{path / 'state.json'}: unknown schema {state.get('schema')!r}, expected {STATE_SCHEMA}"
        )
    book_path = path / "mistake_book.json"
    state["book"] = json.loads(book_path.read_text(encoding="utf-8")) if book_path.is_file() else None
    if restore_rng:
        version, internal, gauss = state["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
    return state


def reset(checkpoint_dir: str | Path) -> None:
    """Forget every checkpoint (a fresh run, or a config that no longer matches)."""
    shutil.rmtree(ckpt_root(checkpoint_dir), ignore_errors=True)


@task(name="checkpoint", task_run_name="checkpoint[it={iteration}]", cache_policy=NO_CACHE, retries=1)
def checkpoint(
    checkpoint_dir: str,
    iteration: int,
    policies: dict[str, Any],
    book: dict[str, Any] | None,
    state: dict[str, Any],
    keep: int = 2,
) -> str:
    """Prefect task: :func:`save_checkpoint`; returns the folder path."""
    return str(save_checkpoint(checkpoint_dir, iteration, policies, book, state, keep))


def resume_or_start(
    checkpoint_dir: str | Path,
    resume: str,
    fingerprint: str,
    total: int | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Where a training run starts: ``{"iteration", "history", "run_id", "book", "path"}``.

    ``resume: auto`` continues from ``LATEST`` when its config fingerprint matches (and reuses the MLflow
    run id recorded in ``run.json`` even before the first checkpoint); ``total`` steps below the checkpoint's
    iteration is a :class:`CheckpointError` (nothing to train, and registering its weights again as iteration
    ``total`` would be wrong). A different training config says which keys changed (``config``: this run's
    flat config) and moves the old checkpoints to ``checkpoints.previous``; ``resume: never`` forgets them.
    """
    root = ckpt_root(checkpoint_dir)
    info_path = root / "run.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    fresh = {"iteration": 0, "history": [], "run_id": None, "book": None, "path": None}
    if resume != "auto":
        reset(checkpoint_dir)
        return fresh
    if info.get("fingerprint") not in (None, fingerprint):
        keep_previous(checkpoint_dir, _changes(info.get("config"), config))
        return fresh
    fresh["run_id"] = info.get("run_id")
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return fresh
    state = load_state(latest)
    if state.get("fingerprint") != fingerprint:
        keep_previous(checkpoint_dir, "its state.json has another config fingerprint")
        return dict(fresh, run_id=None)
    check_step_budget(latest, int(state["iteration"]), total)
    return {
        "iteration": int(state["iteration"]),
        "history": state.get("history", []),
        "run_id": state.get("run_id") or info.get("run_id"),
        "book": state.get("book"),
        "path": latest,
    }


def check_step_budget(latest: Path, iteration: int, total: int | None) -> None:
    """Refuse a run whose ``total`` steps are below the checkpoint it would resume (one line, what to do)."""
    if total is not None and iteration > total:
        raise CheckpointError(
            f"orchestration.max_steps={total} is below the last checkpoint's iteration {iteration} ({latest}): "
            f"raise it to {iteration} or more to finish this run, or set orchestration.resume=never to start over"
        )


def checkpoint_iteration(folder: Path) -> int:
    """The iteration a checkpoint folder holds (its ``state.json``), without restoring anything."""
    return int(json.loads((folder / "state.json").read_text(encoding="utf-8"))["iteration"])


def _changes(old: dict[str, Any] | None, new: dict[str, Any] | None, limit: int = 5) -> str:
    """``reward.alpha: 0.5 -> 0.25, ...``: the keys whose values differ (what changed the fingerprint)."""
    if not old or not new:
        return "the training config changed"
    diff = [
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]
    diff = [d.replace("'", "") for d in diff]
    more = f", and {len(diff) - limit} more" if len(diff) > limit else ""
    return f"the training config changed ({', '.join(diff[:limit])}{more})"


def keep_previous(checkpoint_dir: str | Path, why: str) -> None:
    """Start over without destroying work: say why, then move the checkpoints to ``checkpoints.previous``
    (replacing an older one: one previous run is kept, not an unbounded pile); delete them only when the move
    fails."""
    root = ckpt_root(checkpoint_dir)
    if not any(root.glob("it_*")):
        reset(checkpoint_dir)
        return
    kept = root.parent / "checkpoints.previous"
    try:
        shutil.rmtree(kept, ignore_errors=True)
        os.replace(root, kept)
        where = f"its checkpoints are kept in {kept} (delete it to free the space)"
    except OSError as exc:
        reset(checkpoint_dir)
        where = f"its checkpoints could not be kept ({exc.strerror}) and were deleted"
    log.warning("checkpoint: %s since %s was written; starting at iteration 0, %s", why, root, where)


def done_matches(done: Path, total: int, run_id: str | None) -> bool:
    """Whether ``final/DONE.json`` records this run (``run_id``) finished at ``total`` (export and registration
    done: a retried ``finish()`` skips them)."""
    try:
        info = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("iteration") == total and info.get("run_id") == run_id


def stored_fingerprint(checkpoint_dir: str | Path) -> str | None:
    """The config fingerprint recorded by :func:`save_run_info` (None when absent or unreadable)."""
    try:
        return json.loads((ckpt_root(checkpoint_dir) / "run.json").read_text(encoding="utf-8")).get(
            "fingerprint"
        )
    except (OSError, ValueError, AttributeError):
        return None


def save_run_info(
    checkpoint_dir: str | Path, fingerprint: str, run_id: str | None, config: dict[str, Any] | None = None
) -> None:
    """Record the config fingerprint, MLflow run id and the flat config (what a later changed config is compared
    with) before the first iteration (atomic)."""
    info = {"fingerprint": fingerprint, "run_id": run_id, "config": config}
    write_json_atomic(ckpt_root(checkpoint_dir) / "run.json", info, fsync=True)


HISTORY_FILE = "history.csv"
"""The training history users see: one row per iteration (``dvc plots``, the evaluate report, lab-compare)."""
LAST_ROW_FILE = "metrics.json"


def write_history(checkpoint_dir: str | Path, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Derive the history's files from the checkpointed history (the one record written per iteration, in
    ``state.json``): ``history.csv`` (read back by ``codea1_core.evaluation.comparison.parse_history``) and
    ``metrics.json`` (the last row; ``{"iteration": 0}`` before the first), each atomically; returns the last row.

    Why not per iteration: the checkpoint already holds the history atomically with the weights it belongs to
    (resume reads it there); rewriting two more copies every iteration only cost time.
    """
    import csv
    import io

    keys = sorted({k for row in history for k in row})
    if "iteration" in keys:
        keys.remove("iteration")
        keys.insert(0, "iteration")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, restval="")
    writer.writeheader()
    for row in history:
        writer.writerow(row)
    write_text_atomic(Path(checkpoint_dir) / HISTORY_FILE, buf.getvalue())
    last = dict(history[-1]) if history else {"iteration": 0}
    write_json_atomic(Path(checkpoint_dir) / LAST_ROW_FILE, last, fsync=True)
    return last


# --------------------------------------------------------------------------------------------------
# One training run per workspace
# --------------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _proc_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), '' where unavailable: tells a
    live holder from an unrelated process that reused its pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class WorkspaceLock:
    """``<checkpoint_dir>/train.lock`` holding the holder's pid, host, start time; a context manager.

    Taken with ``O_CREAT | O_EXCL`` (atomic); a lock whose pid is gone (or reused by another process) on this
    host is stale: it is replaced with one warning line. A live holder raises :class:`WorkspaceLockedError`.
    """

    def __init__(self, checkpoint_dir: str | Path):
        self.path = Path(checkpoint_dir) / LOCK_NAME
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") not in (None, socket.gethostname()):
            return False  # another machine's run on a shared disk: never stolen
        pid = int(holder.get("pid") or 0)
        return pid <= 0 or not _alive(pid) or _proc_start(pid) != holder.get("proc_start", _proc_start(pid))

    def acquire(self) -> WorkspaceLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "proc_start": _proc_start(os.getpid()),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:
                    continue  # released meanwhile
                if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                    return self  # this process holds it already (the CLI entry, then the flow): not released here
                if not self._stale(holder):
                    raise WorkspaceLockedError(
                        f"{self.path}: another training run holds this workspace (pid {holder.get('pid')} on "
                        f"{holder.get('host')}, started {holder.get('started')}); wait for it or stop it"
                    ) from None
                log.warning("%s: stale lock of pid %s (started %s) removed", self.path, holder.get("pid"),
                            holder.get("started"))  # fmt: skip
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
            self.held = True
            return self
        raise WorkspaceLockedError(f"{self.path}: could not take the lock (it keeps changing)")

    def release(self) -> None:
        if self.held and (self._holder() or {}).get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> WorkspaceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
