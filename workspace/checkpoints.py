"""Atomic per-iteration checkpoints, verified on resume (docs/method.md §3 step 16; we checkpoint every
iteration).

What it does: :func:`save_checkpoint` writes ``<checkpoint_dir>/checkpoints/it_NNNNNN/`` holding both policies
(``Policy.save``: weights/adapters, optimizer, scheduler, torch RNG), the Mistake Book JSON (a byte-for-byte copy
of the file the step's merge wrote: the book is serialised once per step), ``state.json`` (iteration = data
cursor, config fingerprint, metrics history without wall-clock values) and ``rng.pt`` (torch RNG). Python's
global RNG is not recorded: the method draws nothing from it (its samplers are seeded ``random.Random``
instances and torch's generator), while libraries draw from it at moments that vary from run to run (retry
jitter), so its state would make two runs of the same inputs write different checkpoints (and ``dvc.lock``).
The directory is built under a temporary name and renamed with ``os.replace``; then the ``LATEST`` pointer file
is replaced atomically. A kill at any moment leaves either the previous or the new iteration
complete, never a half-written one. Older iterations beyond ``keep_checkpoints`` are deleted afterwards.
The last file written into a checkpoint is ``MANIFEST.json`` (size and sha256 of every other file, atomic);
:func:`select_checkpoint` verifies it and falls back to the newest intact checkpoint with one warning line
naming what was wrong (truncated weights, zeroed bytes, empty ``rng.pt``...); when none is intact it raises
:class:`CheckpointError` naming the file. :func:`load_state` reads one back and restores torch's RNG.
:func:`verify_model` checks a model folder against its own manifest the same way (the warm start writes one
into each model folder it builds: the KL reference is verified whenever training starts or resumes).
What it does not: decide when to checkpoint (the train flow does), decide where a run starts
(:mod:`workspace.resume`) or log to MLflow.

Tests: ``pytest tests/workspace/test_checkpoints.py tests/workspace/test_checkpoint_faults.py``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from codea1_core.atomic import (
    atomic_dir,
    sha256_file,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)

STATE_SCHEMA = "codea1.train_state/1"
MANIFEST = "MANIFEST.json"
MANIFEST_SCHEMA = "codea1.checkpoint_manifest/1"
log = logging.getLogger("codea1.checkpoint")


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from; the message names the corrupt file and what to do."""


def ckpt_root(checkpoint_dir: str | Path) -> Path:
    """Folder holding the iteration checkpoints and the LATEST pointer."""
    return Path(checkpoint_dir) / "checkpoints"


def save_checkpoint(
    checkpoint_dir: str | Path,
    iteration: int,
    policies: dict[str, Any],
    book: str | Path | None,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write iteration ``iteration`` atomically and move ``LATEST`` to it; returns its folder.

    ``book``: the Mistake Book file of this iteration (``<checkpoint_dir>/mistake_book.json``, as the merge
    task wrote it), copied in byte for byte; None when the run has no book.
    """
    import torch

    root = ckpt_root(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"it_{iteration:06d}"  # built as .it_NNNNNN.tmp; replaces a re-run iteration's folder
    with atomic_dir(final) as tmp:
        for role, policy in policies.items():
            policy.save(tmp / role)
        if book is not None:
            write_bytes_atomic(tmp / "mistake_book.json", Path(book).read_bytes(), fsync=True)
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        full_state = dict(state, schema=STATE_SCHEMA, iteration=iteration)
        write_json_atomic(tmp / "state.json", full_state, fsync=True)
        write_manifest(tmp)  # last: a checkpoint without a matching manifest is never trusted
    write_text_atomic(root / "LATEST", final.name)
    _prune(root, keep, final.name)
    return final


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


def verify_model(folder: str | Path) -> str | None:
    """Why a model folder written with a manifest (the warm start's ``base`` and role folders, the KL reference
    and the starting weights of training) is not intact, naming the file; None when every file matches or the
    folder has no ``MANIFEST.json`` (a user's model, which nothing here wrote)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return None
    return verify_checkpoint(folder)


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
    """Read ``state.json`` (+ ``mistake_book.json`` as ``state['book']``) and restore torch's RNG."""
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
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
    return state


def reset(checkpoint_dir: str | Path) -> None:
    """Forget every checkpoint (a fresh run, or a config that no longer matches)."""
    shutil.rmtree(ckpt_root(checkpoint_dir), ignore_errors=True)


def checkpoint_iteration(folder: Path) -> int:
    """The iteration a checkpoint folder holds (its ``state.json``), without restoring anything."""
    return int(json.loads((folder / "state.json").read_text(encoding="utf-8"))["iteration"])
