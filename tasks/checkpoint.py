"""Atomic per-iteration checkpoints and resume (ALGORITHM.md §3 step 16; our resume rule: every iteration).

What it does: after every iteration writes ``<checkpoint_dir>/checkpoints/it_NNNNNN/`` holding both policies
(``Policy.save``: weights/adapters, optimizer, scheduler, RNG), the Mistake Book JSON, ``state.json``
(iteration = data cursor, config fingerprint, MLflow run id, metrics history, Python RNG) and ``rng.pt``
(torch RNG). The directory is built under a temporary name and renamed with ``os.replace``; then the ``LATEST``
pointer file is replaced atomically. A kill at any moment leaves either the previous or the new iteration
complete, never a half-written one. Older iterations beyond ``keep_checkpoints`` are deleted afterwards.
What it does not: decide when to checkpoint (the train flow does) or log to MLflow.

Run: used by ``flows/train.py``; tested by ``tests/test_checkpoint.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

STATE_SCHEMA = "codea1.train_state/1"


def ckpt_root(checkpoint_dir: str | Path) -> Path:
    """Folder holding the iteration checkpoints and the LATEST pointer."""
    return Path(checkpoint_dir) / "checkpoints"


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to ``path`` via a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text via a temp file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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
    final = root / f"it_{iteration:06d}"
    tmp = root / f".it_{iteration:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for role, policy in policies.items():
        policy.save(tmp / role)
    if book is not None:
        write_json_atomic(tmp / "mistake_book.json", book)
    torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
    full_state = dict(state, schema=STATE_SCHEMA, iteration=iteration, python_rng=_py_rng_state())
    write_json_atomic(tmp / "state.json", full_state)
    if final.exists():  # a re-run of an iteration that completed but whose LATEST write was lost
        shutil.rmtree(final)
    os.replace(tmp, final)
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
    for stale in root.glob(".it_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The last complete iteration's folder (from ``LATEST``), or None when there is none."""
    root = ckpt_root(checkpoint_dir)
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not (path / "state.json").is_file():
        raise RuntimeError(f"{pointer}: points to {path.name}, which has no state.json (corrupt checkpoint)")
    return path


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


def resume_or_start(checkpoint_dir: str | Path, resume: str, fingerprint: str) -> dict[str, Any]:
    """Where a training run starts: ``{"iteration", "history", "run_id", "book", "path"}``.

    ``resume: auto`` continues from ``LATEST`` when its config fingerprint matches (and reuses the MLflow
    run id recorded in ``run.json`` even before the first checkpoint); a different training config, or
    ``resume: never``, forgets the old checkpoints and starts at iteration 0.
    """
    root = ckpt_root(checkpoint_dir)
    info_path = root / "run.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    fresh = {"iteration": 0, "history": [], "run_id": None, "book": None, "path": None}
    if resume != "auto" or info.get("fingerprint") != fingerprint:
        reset(checkpoint_dir)
        return fresh
    fresh["run_id"] = info.get("run_id")
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return fresh
    state = load_state(latest)
    if state.get("fingerprint") != fingerprint:
        reset(checkpoint_dir)
        return dict(fresh, run_id=None)
    return {
        "iteration": int(state["iteration"]),
        "history": state.get("history", []),
        "run_id": state.get("run_id") or info.get("run_id"),
        "book": state.get("book"),
        "path": latest,
    }


def save_run_info(checkpoint_dir: str | Path, fingerprint: str, run_id: str | None) -> None:
    """Record the config fingerprint and MLflow run id before the first iteration (atomic)."""
    write_json_atomic(ckpt_root(checkpoint_dir) / "run.json", {"fingerprint": fingerprint, "run_id": run_id})


def write_history(checkpoint_dir: str | Path, history: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """``history.csv`` (``dvc plots``), ``metrics.jsonl`` (one JSON object per iteration, read by the evaluate
    stage's report) and ``metrics.json`` (the latest values, DVC metrics); each written atomically."""
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
    write_text_atomic(Path(checkpoint_dir) / "history.csv", buf.getvalue())
    lines = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in history)
    write_text_atomic(Path(checkpoint_dir) / "metrics.jsonl", lines)
    write_json_atomic(Path(checkpoint_dir) / "metrics.json", summary)
