"""Where a training run starts and what it records about itself in the workspace.

What it does: :func:`resume_or_start` decides where a run starts (the newest intact checkpoint of the same
config, or iteration 0; ``resume: never`` forgets the checkpoints) and :func:`check_step_budget` refuses a
step budget below it; a changed training config says which keys changed and keeps the old checkpoints in
``checkpoints.previous`` (:func:`keep_previous`). :func:`save_run_info` / :func:`stored_fingerprint` record
the config fingerprint before the first iteration; :func:`done_matches` reads ``final/DONE.json``;
:func:`write_history` derives ``history.csv`` and ``metrics.json`` from the checkpointed history, and
:func:`write_timings` / :func:`with_timings` keep the wall-clock values (:func:`is_timing`) in ``timings.csv``.

Every file this module writes inside a DVC output holds only what the run decides (config, iterations, metrics):
a second run of the same inputs writes the same bytes, so ``dvc.lock`` does not change. Wall-clock values go to
``timings.csv`` beside the outputs; the MLflow run id is kept by ``tracking.results.record_run_id``.
What it does not: write or verify checkpoints (:mod:`workspace.checkpoints`) or hold the lock
(:mod:`workspace.lock`).

Tests: ``pytest tests/workspace/test_resume_history.py tests/workspace/test_checkpoints.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from codea1_core.atomic import write_json_atomic, write_text_atomic
from workspace.checkpoints import CheckpointError, ckpt_root, latest_checkpoint, load_state, log, reset


def resume_or_start(
    checkpoint_dir: str | Path,
    resume: str,
    fingerprint: str,
    total: int | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Where a training run starts: ``{"iteration", "history", "continues", "book", "path"}``.

    ``resume: auto`` continues from ``LATEST`` when its config fingerprint matches (``continues``: the run
    recorded in ``run.json`` goes on, even before its first checkpoint, so its MLflow run is reused); ``total``
    steps below the checkpoint's iteration is a :class:`CheckpointError` (nothing to train, and registering its
    weights again as iteration ``total`` would be wrong). A different training config says which keys changed
    (``config``: this run's flat config) and moves the old checkpoints to ``checkpoints.previous``;
    ``resume: never`` forgets them.
    """
    root = ckpt_root(checkpoint_dir)
    info_path = root / "run.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    fresh = {"iteration": 0, "history": [], "continues": False, "book": None, "path": None}
    if resume != "auto":
        reset(checkpoint_dir)
        return fresh
    if info.get("fingerprint") not in (None, fingerprint):
        keep_previous(checkpoint_dir, _changes(info.get("config"), config))
        return fresh
    fresh["continues"] = info.get("fingerprint") == fingerprint
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return fresh
    state = load_state(latest)
    if state.get("fingerprint") != fingerprint:
        keep_previous(checkpoint_dir, "its state.json has another config fingerprint")
        return dict(fresh, continues=False)
    check_step_budget(latest, int(state["iteration"]), total)
    return {
        "iteration": int(state["iteration"]),
        "history": state.get("history", []),
        "continues": True,
        "book": state.get("book"),
        "path": latest,
    }


def check_step_budget(latest: Path, iteration: int, total: int | None) -> None:
    """Refuse a run whose ``total`` steps are below the checkpoint it would resume (one line, what to do)."""
    if total is not None and iteration > total:
        raise CheckpointError(
            f"orchestration.max_steps={total} is below the last checkpoint's iteration {iteration} ({latest}): "
            f"raise it to {iteration} or more to finish this run, set orchestration.checkpoint_dir to another "
            "folder to train a separate run beside it, or orchestration.resume=never to start over in this one "
            "(its checkpoints are deleted)"
        )


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


def done_matches(done: Path, total: int, fingerprint: str) -> bool:
    """Whether ``final/DONE.json`` records this training config (``fingerprint``) finished at ``total`` (export and
    registration done: a retried ``finish()`` skips them)."""
    try:
        info = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("iteration") == total and info.get("fingerprint") == fingerprint


def stored_fingerprint(checkpoint_dir: str | Path) -> str | None:
    """The config fingerprint recorded by :func:`save_run_info` (None when absent or unreadable)."""
    try:
        return json.loads((ckpt_root(checkpoint_dir) / "run.json").read_text(encoding="utf-8")).get(
            "fingerprint"
        )
    except (OSError, ValueError, AttributeError):
        return None


def save_run_info(checkpoint_dir: str | Path, fingerprint: str, config: dict[str, Any] | None = None) -> None:
    """Record the config fingerprint and the flat config (what a later changed config is compared with) before
    the first iteration (atomic)."""
    info = {"fingerprint": fingerprint, "config": config}
    write_json_atomic(ckpt_root(checkpoint_dir) / "run.json", info, fsync=True)


HISTORY_FILE = "history.csv"
"""The training history users see: one row per iteration (``dvc plots``, the evaluate report, lab-compare)."""
LAST_ROW_FILE = "metrics.json"
TIMINGS_FILE = "timings.csv"
"""The history's wall-clock values, one row per iteration (``iteration`` + the :func:`is_timing` keys): beside the
DVC outputs, not one of them (also logged to MLflow each iteration)."""


def is_timing(key: str) -> bool:
    """Whether a metric is a wall-clock measurement (``time/*_s``, ``*/seconds``, ``*runtime_s``,
    ``*calls_per_s``): it differs on every run of the same inputs, so no DVC output holds it."""
    return key.startswith("time/") or key.endswith(("/seconds", "runtime_s", "calls_per_s"))


def without_timings(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without its :func:`is_timing` keys (what a checkpoint's history and ``history.csv`` hold)."""
    return {k: v for k, v in row.items() if not is_timing(k)}


def _csv(rows: list[dict[str, Any]]) -> str:
    import csv
    import io

    keys = sorted({k for row in rows for k in row})
    if "iteration" in keys:
        keys.remove("iteration")
        keys.insert(0, "iteration")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, restval="")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buf.getvalue()


def write_history(checkpoint_dir: str | Path, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Derive the history's files from the checkpointed history (the one record written per iteration, in
    ``state.json``): ``history.csv`` (read back by ``codea1_core.evaluation.comparison.parse_history``) and
    ``metrics.json`` (the last row; ``{"iteration": 0}`` before the first), each atomically and without wall-clock
    values, which :func:`write_timings` writes; returns the last row (timings included).

    Why not per iteration: the checkpoint already holds the history atomically with the weights it belongs to
    (resume reads it there); rewriting two more copies every iteration only cost time.
    """
    write_text_atomic(Path(checkpoint_dir) / HISTORY_FILE, _csv([without_timings(r) for r in history]))
    last = dict(history[-1]) if history else {"iteration": 0}
    write_json_atomic(Path(checkpoint_dir) / LAST_ROW_FILE, without_timings(last), fsync=True)
    write_timings(checkpoint_dir, history)
    return last


def write_timings(checkpoint_dir: str | Path, history: list[dict[str, Any]]) -> None:
    """``timings.csv``: the iterations of ``history`` that carry wall-clock values, those values only (atomic)."""
    rows = [{"iteration": r["iteration"], **{k: v for k, v in r.items() if is_timing(k)}} for r in history]
    rows = [r for r in rows if len(r) > 1]
    if rows:
        write_text_atomic(Path(checkpoint_dir) / TIMINGS_FILE, _csv(rows))


def with_timings(checkpoint_dir: str | Path, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` (a checkpoint's, without timings) with the wall-clock values ``timings.csv`` kept for its
    iterations (a resumed run's console ETA and ``timings.csv`` continue); rows without any stay as they are."""
    import csv

    try:
        with open(Path(checkpoint_dir) / TIMINGS_FILE, encoding="utf-8", newline="") as fh:
            kept = {int(r["iteration"]): r for r in csv.DictReader(fh)}
    except (OSError, ValueError, KeyError, csv.Error):
        return history
    out = []
    for row in history:
        extra = kept.get(int(row["iteration"]), {})
        try:
            times = {k: float(v) for k, v in extra.items() if is_timing(k) and v != ""}
        except ValueError:  # a hand-edited file: its values are not what this run measured
            times = {}
        out.append({**row, **times})
    return out
