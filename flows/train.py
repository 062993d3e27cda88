"""The ``train`` stage: co-evolve the Code LLM and the Test LLM, one Prefect flow run per training run.

What it does: ALGORITHM.md §3's loop, top to bottom, each step a named Prefect task run (``rollout_code[it=3]``
...): sample B problems (seeded, last partial batch dropped), roll out code, roll out tests (white-box; black-box
for ``selfplay``), gate them, replay the Mistake Book, execute in two phases, score, update the book, build both
GRPO batches (TOPVAR for the Test LLM) and update both policies in the same step, validate every ``eval.every``
steps, checkpoint atomically, log to MLflow. Modes (D10): ``codea1`` (two models), ``golden`` (Code LLM on golden
tests, §7.4), ``selfplay`` (one model plays both roles, same formulas, §18.2). ``resume: auto`` continues from the
last complete iteration with the same MLflow run; no step is logged twice.
What it does not: prepare data, warm-start, or run the benchmark evaluation (other stages).

Outputs (``orchestration.checkpoint_dir``, default ``outputs/train``): ``checkpoints/`` (it_N + LATEST),
``mistake_book.json``, ``outcomes/it_N.parquet``, ``history.csv`` (plots, the evaluate report), ``metrics.json``
(the last row), ``final/{code,test}`` (exported HF dirs for the evaluate stage). The history is recorded once per
iteration, in the checkpoint (``state.json``: what resume reads); ``history.csv`` and ``metrics.json`` are derived
from it by :func:`finish` (and on SIGTERM).

Faults (issue 21): one run per workspace (``train.lock``); before the flow starts, checkpoints are verified
(fallback to the newest intact one) and the MLflow store is probed, so these fail in one line. ``finish()`` is
idempotent and rewrites every non-persistent DVC out from the last checkpoint (DVC deletes them before a
re-run: a resumed run with nothing left to do must still complete the stage), and registers one model version
per completed run. SIGTERM stops the run after the current task (the last checkpoint stands; exit 143).

Run: ``python -m flows.train [--params params.yaml] [key=value ...]`` or ``codea1 train``; the same
``train_flow(params, overrides, run_dir)`` is the ``train/codea1-train`` deployment.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.config import Config, ConfigError, load_config
from codea1_core.files import write_bytes_atomic, write_json_atomic
from codea1_core.method import loop
from codea1_core.models.loading import build_policy
from flows.common import UserError, flow_config, flow_run_name, record_numerics, run_label, stage_main
from tasks import checkpoint as ckpt
from tasks.execute import execute, execute_golden
from tasks.mistake_book import merge_mistake_book, retrieve_replay
from tasks.rollout import (
    drop_overlong_problems,
    extract_codes,
    gate_tests,
    rollout_code,
    rollout_tests,
)
from tasks.score import evaluate, score, write_outcomes
from tasks.tracking import log_iteration, make_tracker
from tasks.update import update_code, update_test

log = logging.getLogger("codea1.train")


@dataclass
class TrainRun:
    """What one training run holds between iterations (built by :func:`setup`)."""

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
    stop: threading.Event | None = None
    """Set by SIGTERM: :func:`iteration` stops before its next task."""

    @property
    def code_pol(self) -> Any:
        return self.policies["code"]

    @property
    def test_pol(self) -> Any:
        return self.policies.get("test", self.policies["code"])


def as_task(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a Prefect task (a named task run in the UI) under ``orchestration.task_timeout_s``.

    Collections and objects are passed ``quote``-d: Prefect then skips walking them for futures (B*M*N
    completions with their token ids would otherwise be visited element by element on every call).
    """
    from prefect.utilities.annotations import quote

    cfg = kwargs.get("cfg") or next((a for a in args if isinstance(a, Config)), None)
    if cfg is not None and cfg.orchestration.task_timeout_s > 0:
        task = task.with_options(timeout_seconds=cfg.orchestration.task_timeout_s)
    plain = (int, float, str, bool, type(None), Config)
    args = tuple(a if isinstance(a, plain) else quote(a) for a in args)
    kwargs = {k: v if isinstance(v, plain) else quote(v) for k, v in kwargs.items()}
    return task(*args, **kwargs)


def as_function(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a task's plain function (no Prefect): the baseline of ``bench/iteration_bench.py``."""
    return getattr(task, "fn", task)(*args, **kwargs)


def run_name(cfg: Config) -> str:
    """``train-<mode>-seed<seed>-alpha<α>[-no-book]``: the MLflow run's name (runs that differ are told apart)."""
    return f"train-{run_label(cfg)}"


@flow(name="train", flow_run_name=flow_run_name, log_prints=True)
def train_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, run_dir: str = ""
) -> dict[str, Any]:
    """Prefect entry point (DVC stage, CLI and the ``train/codea1-train`` deployment): a params file +
    ``key=value`` overrides (``mode=golden``, ...), trained into ``run_dir`` when given (``flows.common``)."""
    cfg = flow_config(params, overrides, run_dir)
    record_numerics(cfg, "train")
    return train(cfg)


class Stopped(Exception):
    """SIGTERM arrived: the run stops before its next task (the last checkpoint stands)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """While inside: SIGTERM sets the returned event (a second SIGTERM exits at once with 143).

    Why: Prefect's own SIGTERM bridge tears the run down from wherever it is (minutes, with tracebacks);
    stopping between tasks keeps the workspace resumable. Only the main thread can install a handler.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise SystemExit(143)
        stop.set()
        log.warning("train: SIGTERM received: stopping after the current task (send it again to stop now)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(cfg: Config) -> dict[str, Any]:
    """The training loop of §3 (runs inside :func:`train_flow`); ``{"stopped": True, ...}`` after SIGTERM."""
    from sandbox import make_executor

    with ckpt.WorkspaceLock(cfg.orchestration.checkpoint_dir), stop_on_sigterm() as stop:
        run = setup(cfg, make_tracker)
        run.stop = stop
        try:
            with make_executor(cfg.sandbox) as run.executor:
                if run.start == 0 and cfg.eval.every > 0 and run.val_set:  # validate first (§3 step 16)
                    val = evaluate(run.code_pol, run.val_set, cfg, run.executor, 0)
                    log_iteration(run.tracker, 0, {"iteration": 0, **val})
                for it in range(run.start + 1, run.total + 1):
                    iteration(run, it)
                summary = finish(run)
        except Stopped:
            ckpt.write_history(run.out_dir, run.history)  # the iterations done stay visible (dvc plots)
            run.tracker.end("KILLED")
            done = int(run.history[-1]["iteration"]) if run.history else 0
            return {"stopped": True, "iteration": done}
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: never hides the failure itself
                ckpt.write_history(run.out_dir, run.history)
            run.tracker.end("FAILED")  # a re-run resumes the same MLflow run
            raise
    run.tracker.end("FINISHED")
    return summary


def setup(cfg: Config, tracker_factory: Any) -> TrainRun:
    """Problems, resume state, tracker, policies (restored from the last checkpoint) and the Mistake Book."""
    from codea1_core.method.mistake_book import starting_book
    from codea1_core.method.parsing import silence_parse_warnings

    silence_parse_warnings()  # SyntaxWarnings about generated text stay off the console
    quiet_progress_bars()  # "Loading weights" / "Writing model shards" on every checkpoint: not in the log
    out_dir = Path(cfg.orchestration.checkpoint_dir)
    train_set, val_set = load_problems(cfg)
    train_set, dropped = drop_overlong_problems(train_set, cfg)
    if dropped:
        log.warning("train: %d problems dropped, code prompt > data.max_prompt_tokens=%d tokens (first: %s)",
                    len(dropped), cfg.data.max_prompt_tokens, ", ".join(dropped[:5]))  # fmt: skip
    total = training_steps(cfg, len(train_set))
    fingerprint = loop.config_fingerprint(cfg.flat())
    state = ckpt.resume_or_start(out_dir, cfg.orchestration.resume, fingerprint)
    tracker = tracker_factory(cfg, run_id=state["run_id"], run_name=run_name(cfg))
    ckpt.save_run_info(out_dir, fingerprint, tracker.run_id)
    for row in state["history"]:  # backfill iterations checkpointed before a kill but not yet logged
        log_iteration.fn(tracker, int(row["iteration"]), row)
    seed_everything(cfg.seed)  # adapter initialisation is part of the run's identity
    policies = {"code": build_policy(cfg.model.code_path, cfg, "code", total)}
    if cfg.mode == "codea1":  # selfplay: one model plays both roles; golden: no Test LLM
        policies["test"] = build_policy(cfg.model.test_path, cfg, "test", total)
    book = starting_book(cfg, state["book"])
    if state["path"] is not None:
        for role, pol in policies.items():
            pol.load(state["path"] / role)
    log.info("train: mode=%s, %d problems, %d steps, resuming after iteration %d", cfg.mode, len(train_set), total,
             state["iteration"])  # fmt: skip
    return TrainRun(cfg, train_set, val_set, total, state["iteration"], fingerprint, policies, book, tracker,
                    state["history"], out_dir)  # fmt: skip


def iteration(run: TrainRun, it: int, call: Any = as_task) -> dict[str, Any]:
    """One training step, ALGORITHM.md §3 steps 1-16, each piece a task run named ``<task>[it=N]``."""
    from codea1_core.method.outcomes import plan_golden, plan_problem

    cfg, ex, times = run.cfg, run.executor, {}
    golden, selfplay = cfg.mode == "golden", cfg.mode == "selfplay"

    def timed(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        if run.stop is not None and run.stop.is_set():
            raise Stopped(name)
        t0 = time.perf_counter()
        out = call(task, *args, **kwargs)
        times[f"time/{name}_s"] = time.perf_counter() - t0
        return out

    t_iter = time.perf_counter()
    idx = loop.batch_indices(len(run.train_set), cfg.data.train_batch_size, cfg.data.seed, it - 1)  # step 1
    problems = [run.train_set[i] for i in idx]
    code_out = timed("rollout_code", rollout_code, run.code_pol, problems, cfg, it)  # step 2
    codes = extract_codes(code_out)  # step 3
    metrics: dict[str, float] = {}
    test_out = test_batch = None
    if golden:  # §7.4: golden tests only, no Test LLM
        plans = [plan_golden(p, c) for p, c in zip(problems, codes, strict=True)]
        outcomes, sb = timed("execute", execute_golden, ex, plans, cfg, it)
        scores, sm = timed("score", score, outcomes, cfg, it, golden=True)
        merge_mistake_book.fn(None, outcomes, it, run.out_dir / "mistake_book.json")  # a DVC out in all modes
    else:
        args = (run.test_pol, problems, codes, cfg, it, selfplay)
        test_out = timed("rollout_tests", rollout_tests, *args)  # steps 4-5 (black-box prompts for selfplay)
        suites, gate_m = timed("gate_tests", gate_tests, problems, test_out, cfg, it)  # step 6 + GX gate
        replay = retrieve_replay(run.book, problems, cfg)  # step 7, before this step's book update
        plans = [plan_problem(*a) for a in zip(problems, codes, suites, replay, strict=True)]
        outcomes, sb = timed("execute", execute, ex, plans, cfg, it)  # step 8
        scores, sm = timed("score", score, outcomes, cfg, it)  # step 9
        book_path = run.out_dir / "mistake_book.json"
        book_m = timed("merge_mistake_book", merge_mistake_book, run.book, outcomes, it, book_path)
        metrics |= gate_m | book_m  # step 10
        groups, _ = loop.test_groups(test_out, scores, cfg.grpo.update_n)  # step 11: TOPVAR
        test_batch = loop.build_group_batch(groups, cfg.grpo)
    code_batch = loop.build_group_batch(loop.code_groups(code_out, scores), cfg.grpo)  # steps 12-14
    if selfplay:  # one model learns from both roles' samples in one step (§18.2)
        metrics |= timed("update_code", update_code, run.code_pol, code_batch.concat(test_batch), it)
    else:  # step 15: both policies update from the same rollouts
        metrics |= timed("update_code", update_code, run.code_pol, code_batch, it)
        if test_batch is not None:
            metrics |= timed("update_test", update_test, run.test_pol, test_batch, it)
    if cfg.eval.every > 0 and it % cfg.eval.every == 0 and run.val_set:  # step 16
        metrics |= timed("evaluate", evaluate, run.code_pol, run.val_set, cfg, ex, it)
    parquet = write_outcomes(run.out_dir / "outcomes" / f"it_{it:06d}.parquet", outcomes)
    times["time/iteration_s"] = time.perf_counter() - t_iter
    row = {"iteration": it, **metrics, **sm, **sb, **times}
    run.history.append(row)  # recorded once, in the checkpoint's state (history.csv is derived at the end)
    state = {"fingerprint": run.fingerprint, "run_id": run.tracker.run_id, "history": run.history}
    book = run.book.to_dict() if run.book is not None else None
    call(ckpt.checkpoint, str(run.out_dir), it, run.policies, book, state, cfg.orchestration.keep_checkpoints)
    samples = loop.sample_rows(problems, code_out, test_out, scores, cfg.tracking.log_samples)
    files = {"outcomes": str(parquet), "mistake_book": str(run.out_dir / "mistake_book.json")}
    call(log_iteration, run.tracker, it, row, samples, files)
    print(progress_line(it, run.total, row, run.history))  # log_prints: console and the Prefect run's logs
    return row


def progress_line(it: int, total: int, row: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """``it 5/95  code_r .71  test_r .17  MB 412  5.1 s/it  ETA 7 min``: one line per iteration.

    ``s/it`` is the mean of the last 10 iterations (a resumed run's included), so the ETA follows the load.
    Fields a mode does not have (``test_r`` in golden, ``MB`` without a Mistake Book) are left out.
    """
    recent = [r["time/iteration_s"] for r in history[-10:] if "time/iteration_s" in r] or [0.0]
    per_it = sum(recent) / len(recent)
    parts = [f"it {it}/{total}", f"code_r {_short(row.get('code/reward_mean'))}"]
    if "test/reward_mean" in row:
        parts.append(f"test_r {_short(row['test/reward_mean'])}")
    if "mistake_book/size" in row:
        parts.append(f"MB {int(row['mistake_book/size'])}")
    parts += [f"{per_it:.1f} s/it", f"ETA {_duration((total - it) * per_it)}"]
    return "  ".join(parts)


def _short(value: Any) -> str:
    """``0.71`` -> ``.71`` (rewards are in [0, 1]: two digits say enough); missing -> ``-``."""
    if not isinstance(value, (int, float)) or value != value:
        return "-"
    return f"{value:.2f}".replace("0.", ".", 1)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def quiet_progress_bars() -> None:
    """Turn off the transformers / huggingface_hub progress bars (printed on every load and save)."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so initialisation does not depend on what ran before in the process."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def training_steps(cfg: Config, n_problems: int) -> int:
    """The run's number of steps (``loop.total_steps``); a config with none is a one-line UserError."""
    total = loop.total_steps(
        n_problems, cfg.data.train_batch_size, cfg.data.epochs, cfg.orchestration.max_steps
    )
    if total < 1:
        raise UserError(
            f"no training step: {n_problems} problems, data.train_batch_size={cfg.data.train_batch_size}, "
            f"data.epochs={cfg.data.epochs}, orchestration.max_steps={cfg.orchestration.max_steps}"
        )
    return total


def load_problems(cfg: Config) -> tuple[list[Any], list[Any]]:
    """Prepared train/val problems (``data/prepared``); lab-only configs fall back to generating them."""
    prepared = Path(cfg.data.prepared_dir)
    if (prepared / "train.parquet").is_file():
        from codea1_core.data.prepared import load_prepared

        val = load_prepared(prepared / "val.parquet") if (prepared / "val.parquet").is_file() else []
        return load_prepared(prepared / "train.parquet"), val
    if set(cfg.data.train_sources) <= {"lab"}:
        from codea1_core.data.lab import lab_problems

        log.warning("%s/train.parquet absent: generating the lab problems in memory", prepared)
        return lab_problems(cfg.lab, "train"), lab_problems(cfg.lab, "val")
    raise UserError(
        f"{prepared}/train.parquet not found: run `codea1 prepare` (or `dvc repro prepare`) first"
    )


def fault_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``$CODEA1_KILL_AT`` says so (tests/test_wedge.py)."""
    if os.environ.get("CODEA1_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def finish(run: TrainRun) -> dict[str, Any]:
    """Write every output of the stage from the last checkpoint, export and register the final policies.

    Idempotent, and safe to kill at any point: DVC deletes the stage's non-persistent outs before re-running
    it, so a resumed run with no iteration left rewrites them here; registration reuses the version of this
    MLflow run and iteration when one exists (one model version per completed run).
    """
    from codea1_core.evaluation.report import training_chart
    from codea1_core.method.mistake_book import MistakeBook

    final = run.out_dir / "final"
    done = final / "DONE.json"
    summary = ckpt.write_history(run.out_dir, run.history)
    book = run.book if run.book is not None else MistakeBook(enabled=False)
    write_json_atomic(run.out_dir / "mistake_book.json", book.to_dict(), fsync=True)
    fault_point("finish:history")
    if _done_matches(done, run) and all((final / role).is_dir() for role in run.policies):
        return summary
    png = training_chart(run.history)
    if png is not None:  # reward curves + Mistake Book dynamics, also in the MLflow run
        write_bytes_atomic(final.parent / "plots" / "training.png", png)
        run.tracker.log_file(final.parent / "plots" / "training.png", "plots")
    versions = {}
    for role, pol in run.policies.items():
        pol.export(final / role)
        fault_point(f"finish:export_{role}")
        versions[role] = run.tracker.register(role, final / role, run.total)
        fault_point(f"finish:register_{role}")
    write_json_atomic(
        done, {"iteration": run.total, "versions": versions, "run_id": run.tracker.run_id}, fsync=True
    )
    fault_point("finish:done")
    return summary


def _done_matches(done: Path, run: TrainRun) -> bool:
    try:
        info = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("iteration") == run.total and info.get("run_id") == run.tracker.run_id


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


def preflight(cfg: Config) -> None:
    """What would fail later, checked before the flow starts: checkpoints (verified, with fallback) and the
    MLflow store (probed, <= 10 s). Raises the tasks' errors; :func:`run` turns them into one line."""
    from tasks.tracking import probe_store

    out_dir = Path(cfg.orchestration.checkpoint_dir)
    training_steps(cfg, len(load_problems(cfg)[0]))  # cheap (parquet or lab); setup() checks after filtering
    same = ckpt.stored_fingerprint(out_dir) == loop.config_fingerprint(cfg.flat())
    if cfg.orchestration.resume == "auto" and same:
        ckpt.select_checkpoint(out_dir)
    if cfg.tracking.backend == "mlflow":
        probe_store(cfg)


def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """DVC/CLI entry point (``flows.common.stage_main``): lock, preflight, then :func:`train_flow` with the same
    ``params`` and ``overrides``; user errors in one line (a config that cannot fit its GPU stops first,
    ``flows.plan``)."""
    from flows.plan import check_training_fits
    from tasks.tracking import TrackingUnavailable

    overrides = list(overrides or [])
    cfg = load_config(params, overrides)
    check_training_fits(cfg)
    quiet_user_error_tracebacks()
    try:
        with ckpt.WorkspaceLock(cfg.orchestration.checkpoint_dir):
            preflight(cfg)
            summary = train_flow(params=params, overrides=overrides)
    except (ckpt.WorkspaceLockedError, ckpt.CheckpointError, TrackingUnavailable) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        raise UserError(f"{exc.filename or cfg.orchestration.checkpoint_dir}: {exc.strerror}") from None
    if summary.get("stopped"):
        print(f"train: stopped by SIGTERM after iteration {summary['iteration']} (checkpointed): run it again "
              "to resume", file=sys.stderr)  # fmt: skip
        raise SystemExit(143)
    return summary


class _UserErrorFilter(logging.Filter):
    """Drop the traceback Prefect attaches when a flow or task fails with a user error (one line is enough)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UserError | ConfigError) or (
            isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS
        ):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks() -> None:
    """Install :class:`_UserErrorFilter` on Prefect's run loggers (once)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorFilter) for f in logger.filters):
            logger.addFilter(_UserErrorFilter())


if __name__ == "__main__":
    raise SystemExit(stage_main(run, "Co-evolution training (Code-A1)"))
