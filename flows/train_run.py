"""What one training run starts from and holds between iterations, checked before the flow starts.

What it does: :class:`TrainRun` is the run's state between iterations (problems, policies, the Mistake Book,
the tracker, the history); :func:`load_problems` reads the prepared problems (the lab's are generated when a
lab-only config has none), :func:`training_steps` is the run's number of steps, :func:`seed_everything`
seeds Python, NumPy and torch; :func:`preflight` checks what would fail later (checkpoints, the MLflow
store, the model folders) so a bad input is one line before any work.
What it does not: build the run (``flows/train.py``'s ``setup``) or map errors to lines
(``flows/run_endings.py``).

Tests: ``tests/flows/test_train_inputs.py``, ``tests/flows/test_resume_guards.py``,
``tests/flows/test_fail_fast.py``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from codea1_core.method import batches
from flows.common import UserError

log = logging.getLogger("codea1.train")


@dataclass
class TrainRun:
    """What one training run holds between iterations (built by ``flows.train.setup``)."""

    cfg: Config
    train_set: list[Any]
    val_set: list[Any]
    total: int
    start: int
    fingerprint: str
    policies: dict[str, Any]
    book: Any
    tracker: Any
    history: list[dict[str, Any]]
    out_dir: Path
    executor: Any = None
    stop: threading.Event | None = (
        None  # set by SIGTERM: ``flows.train.iteration`` stops before its next task
    )
    summary: dict[str, Any] | None = None  # what train() returns: finish()'s row or {"stopped": True, ...}

    @property
    def code_pol(self) -> Any:
        return self.policies["code"]

    @property
    def test_pol(self) -> Any:
        return self.policies.get("test", self.policies["code"])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so initialisation does not depend on what ran before in the process."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def training_steps(cfg: Config, n_problems: int) -> int:
    """The run's number of steps (``batches.total_steps``); a config with none is a one-line UserError."""
    total = batches.total_steps(
        n_problems, cfg.data.train_batch_size, cfg.data.epochs, cfg.orchestration.max_steps
    )
    if total < 1:
        raise UserError(
            f"no training step: {n_problems} problems, data.train_batch_size={cfg.data.train_batch_size}, "
            f"data.epochs={cfg.data.epochs}, orchestration.max_steps={cfg.orchestration.max_steps}"
        )
    return total


def load_problems(cfg: Config) -> tuple[list[Any], list[Any]]:
    """Prepared train/val problems (``data/prepared``); lab-only configs fall back to generating them. A file
    that another config prepared, or that records nothing (``prepared.check_record``), is one line."""
    prepared = Path(cfg.data.prepared_dir)
    if (prepared / "train.parquet").is_file():
        from codea1_core.data.dataset_types import DatasetError
        from codea1_core.data.prepared import check_record, load_prepared

        files = [prepared / name for name in ("train.parquet", "val.parquet")]
        try:  # a truncated or malformed file, or another config's: one line naming it
            for path in (f for f in files if f.is_file()):
                check_record(path, cfg)
            val = load_prepared(files[1]) if files[1].is_file() else []
            return load_prepared(files[0]), val
        except DatasetError as exc:
            raise UserError(str(exc)) from None
    if set(cfg.data.train_sources) <= {"lab"}:
        from codea1_core.data.lab import lab_problems

        log.warning("%s/train.parquet absent: generating the lab problems in memory", prepared)
        return lab_problems(cfg.lab, "train"), lab_problems(cfg.lab, "val")
    raise UserError(
        f"{prepared}/train.parquet not found: run `codea1 prepare` (or `dvc repro prepare`) first"
    )


def preflight(cfg: Config) -> None:
    """What would fail later, checked before the flow starts: checkpoints (verified, with fallback; a step budget
    below the last one), the MLflow store (probed, <= 10 s) and the model folders. Raises the workspace's and
    tracking's errors; ``flows.run_endings.run_guarded`` turns them into one line."""
    from tracking.store import probe_store
    from workspace.checkpoints import checkpoint_iteration, select_checkpoint
    from workspace.resume import check_step_budget, stored_fingerprint

    out_dir = Path(cfg.orchestration.checkpoint_dir)
    # cheap (parquet or lab); flows.train.setup checks again after filtering
    total = training_steps(cfg, len(load_problems(cfg)[0]))
    same = stored_fingerprint(out_dir) == batches.config_fingerprint(cfg.flat())
    latest = select_checkpoint(out_dir) if cfg.orchestration.resume == "auto" and same else None
    if latest is not None:  # a step budget below the checkpoint: refused before the flow starts
        check_step_budget(latest, checkpoint_iteration(latest), total)
    if cfg.tracking.backend == "mlflow":
        probe_store(cfg)
    for role in ("code", "test") if cfg.mode == "codea1" else ("code",):
        check_model_path(cfg, role)


def check_model_path(cfg: Config, role: str) -> None:
    """A local model folder that is missing (the warm start not run yet) is one line; so is a Hub id (``org/name``,
    one slash) that is neither in the Hugging Face cache nor reachable now (``codea1_core.models.preflight``:
    no minutes of the loader's retries)."""
    from codea1_core.config import ConfigError
    from codea1_core.models.preflight import check_model_source

    path = getattr(cfg.model, f"{role}_path")
    try:
        check_model_source(path, f"model.{role}_path")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    local = Path(path).is_absolute() or path.startswith(".") or path.count("/") != 1
    if local and not Path(path).is_dir():
        raise UserError(
            f"model.{role}_path={path}: no such folder: run the warmstart stage (`dvc repro warmstart`) "
            f"or point model.{role}_path at a model"
        )
