"""Training on several GPUs or machines: torchrun launch, rank sharding and rank-0 orchestration of ``flows.train``.

What it does: ``codea1 train distributed.nproc_per_node=N ...`` checks what needs no rank (the train preflight),
then re-executes the same command under ``torchrun --nproc-per-node N`` (:func:`launch`, torchrun run by this
module's ``__main__``: a failed rank ends the command with one line naming it, :func:`stopped_line`; multi-node:
run the ``torchrun`` line of docs/distributed.md on every node). Each rank joins the process group with
``distributed.timeout_s`` as the collective timeout (:func:`join`), wraps both policies
(``codea1_core.models.distributed``: DDP or FSDP2) and runs ``flows.train``'s loop on its shard of every step's
problems. The loop's hooks here keep ONE run:

* :func:`shard_problems` -- rank r takes the r-th contiguous shard of the step's B problems;
* :func:`gather_outcomes` -- every rank gets all B outcome matrices (rank order = problem order), so the
  rewards' step metrics and the Mistake Book update are computed on the whole batch, identically on every
  rank (why gather rather than shard the book by problem id: a problem lands on a different rank from step
  to step, the update is microseconds per problem, and one identical book on every rank keeps retrieval
  local, the checkpoint unchanged and resumable at any world size);
* :func:`local_part` -- this rank's slice of what was computed for all problems (its advantages);
* :func:`reduce_row` -- the rank-local metrics (gate, sandbox, timings, sample counts) reduced over ranks;
* rank 0 alone owns the Prefect flow run, the MLflow run, the workspace lock, the checkpoint and the final
  export (:func:`is_main`); the other ranks run the same loop as plain functions with a null tracker.

What it does not: the reduction of gradients (``codea1_core.models.distributed``), or vLLM (one engine per
rank, each rank's ``rollout.*`` settings; docs/distributed.md).

Run: ``codea1 train distributed.nproc_per_node=2`` (CPU: gloo) or
``torchrun --nproc-per-node 2 -m flows.train [key=value ...]``; tests: ``pytest tests/flows/test_distributed*.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from codea1_core.config import Config
from codea1_core.models import distributed as dp
from flows.common import UserError

T = TypeVar("T")
log = logging.getLogger("codea1.train")

is_main = dp.is_main
gather_for_save = dp.gather_for_save  # FSDP2: every rank, before rank 0 saves or exports


def under_torchrun() -> bool:
    """True inside a process ``torchrun`` started (it sets ``TORCHELASTIC_RUN_ID`` / ``LOCAL_RANK``)."""
    return "LOCAL_RANK" in os.environ


def launch(cfg: Config, argv: list[str]) -> int | None:
    """Re-execute ``python -m flows.train argv...`` under torchrun when ``distributed.nproc_per_node`` > 1.

    The checks of ``flows.train_run.preflight`` run here first, once (a step budget below the workspace's last
    checkpoint is one line before any rank starts). torchrun runs through :func:`torchrun` (this module's
    ``__main__``), so a failed rank ends the command with one line (:func:`stopped_line`) instead of
    torchrun's traceback. Returns torchrun's exit code, or None when nothing was launched (one rank, or already
    under torchrun).
    """
    n = cfg.distributed.nproc_per_node
    if n <= 1 or under_torchrun():
        return None
    if cfg.data.train_batch_size % n:
        raise UserError(
            f"data.train_batch_size={cfg.data.train_batch_size} is not divisible by "
            f"distributed.nproc_per_node={n}: every rank takes an equal shard of the step's problems"
        )
    check_before_ranks(cfg)
    cmd = [sys.executable, "-m", "flows.distributed", "--standalone", f"--nproc-per-node={n}"]
    cmd += ["-m", "flows.train", *argv]
    log.info("train: %d ranks: torchrun %s", n, " ".join(cmd[3:]))
    with tempfile.TemporaryDirectory(prefix="codea1-ranks-") as tmp:
        report = Path(tmp) / "failure.json"
        code = subprocess.call(cmd, env={**os.environ, FAILURE_FILE_ENV: str(report)})
        failure = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    # 2: torchrun's own usage error, already one line; 143: SIGTERM, already reported
    if code not in (0, 2, 143):
        print(stopped_line(cfg, code, failure), file=sys.stderr)
    return code


def check_before_ranks(cfg: Config) -> None:
    """``flows.train_run.preflight`` in the launching process (checkpoints, step budget, MLflow store, model
    folders): its errors are one :class:`~flows.common.UserError` line, as ``flows.run_endings`` makes them."""
    from flows.train_run import preflight
    from tracking.store import TrackingUnavailable
    from workspace.checkpoints import CheckpointError

    try:
        preflight(cfg)
    except (CheckpointError, TrackingUnavailable) as exc:
        raise UserError(str(exc)) from None


def stopped_line(cfg: Config, code: int, failure: dict[str, Any] | None = None) -> str:
    """The one line after torchrun stopped all ranks (exit ``code``): the first failing rank's own line when it
    stopped on a user error (rerunning cannot help: no resume advice), else which rank died, hung or failed
    and the checkpoint the same command resumes from. ``failure``: what :func:`torchrun` recorded."""
    from workspace.checkpoints import latest_checkpoint

    head = f"train: stopped (torchrun exit {code})"
    n, timeout = cfg.distributed.nproc_per_node, cfg.distributed.timeout_s
    kind = (failure or {}).get("kind")
    if failure and kind == "user":
        return f"{head}: rank {failure['rank']}/{n}: {failure['message']}"
    if failure and failure.get("signal"):
        what = f"rank {failure['rank']}/{n} died ({failure['signal']})"
    elif failure and kind == "error":
        what = f"rank {failure['rank']}/{n} failed: {failure['message']}"
    elif failure and kind == "collective":
        what = (
            f"rank {failure['rank']}/{n} lost its peers: a rank died or hung past "
            f"distributed.timeout_s={timeout:g}"
        )
    else:
        what = f"a rank failed, died or hung (collective timeout distributed.timeout_s={timeout:g})"
    last = latest_checkpoint(cfg.orchestration.checkpoint_dir)
    where = f"the last checkpoint is {last}" if last is not None else "no checkpoint was written yet"
    return f"{head}: {what}; {where}; run the same command again to resume, at any distributed.nproc_per_node"


FAILURE_FILE_ENV = "CODEA1_RANK_FAILURE"
"""Where :func:`torchrun` writes the first failing rank's record for :func:`launch` (JSON)."""


def torchrun(args: list[str]) -> int:
    """``torchrun args...`` in this process (what :func:`launch` starts): when a rank fails, the first failure
    (torchrun's root cause: rank, exit code or signal, the line the rank recorded with :func:`record_failure`)
    goes to ``$CODEA1_RANK_FAILURE`` and the exit code is 1, without torchrun's traceback and failure table
    (the ranks' own output has already said what happened)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(args))
    except ChildFailedError as exc:
        rank, first = exc.get_first_failure()
        data = first.error_file_data if isinstance(first.error_file_data.get("kind"), str) else {}
        record = {
            "rank": rank,
            "exitcode": first.exitcode,
            "signal": first.signal_name() if first.exitcode < 0 else None,
            "kind": data.get("kind"),
            "message": data.get("message"),
        }
        if os.environ.get(FAILURE_FILE_ENV):
            from codea1_core.atomic import write_json_atomic

            write_json_atomic(Path(os.environ[FAILURE_FILE_ENV]), record)
        return 1
    return 0


def record_failure(exc: BaseException) -> None:
    """Under torchrun: this rank's failure as one line in torchrun's error file (``$TORCHELASTIC_ERROR_FILE``,
    the format torch's ``ProcessFailure`` reads), so the launcher names the first failing rank and its reason.
    ``kind``: ``user`` (a :class:`~flows.common.UserError`: its line says what to change), ``collective`` (a
    peer died or hung) or ``error`` (anything else)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not under_torchrun():
        return
    text = str(exc).splitlines()[0] if str(exc) else "no message"
    if isinstance(exc, PeersLost):
        kind = "collective"
    elif isinstance(exc, UserError):
        kind = "user"
    else:
        kind, text = "error", f"{type(exc).__name__}: {text}"
    data = {"message": text, "timestamp": int(time.time()), "kind": kind}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data), encoding="utf-8")


STARTUP_TIMEOUT_S = 1800.0
"""How long ranks wait for each other at start-up (rank 0 starts Prefect and MLflow first: minutes on a busy
machine); ``distributed.timeout_s`` bounds every collective after that."""
_startup: list[Any] = []


def join(cfg: Config) -> None:
    """Join torchrun's process group (timeout ``distributed.timeout_s``); B must split evenly over the ranks."""
    if not under_torchrun():
        return
    import datetime

    dp.init_from_env(cfg.distributed.backend, cfg.distributed.timeout_s)
    timeout = datetime.timedelta(seconds=max(STARTUP_TIMEOUT_S, cfg.distributed.timeout_s))
    _startup[:] = [dist.new_group(backend="gloo", timeout=timeout)]
    world = dp.world_size()
    if cfg.data.train_batch_size % world:
        raise UserError(
            f"data.train_batch_size={cfg.data.train_batch_size} is not divisible by the world size {world}"
        )


def wrap_policies(policies: dict[str, Any], cfg: Config) -> None:
    """DDP / FSDP2 around each policy (before any checkpoint is restored into it); no-op on one rank."""
    if _startup:  # every rank is here: rank 0's Prefect/MLflow start-up is not a collective timeout
        dist.barrier(group=_startup[0])
    if dp.world_size() == 1:
        if cfg.distributed.nproc_per_node > 1:
            log.warning(
                "train: distributed.nproc_per_node=%d but one rank: start it with `codea1 train` or "
                "torchrun (docs/distributed.md)",
                cfg.distributed.nproc_per_node,
            )
        return
    for pol in policies.values():
        dp.wrap_policy(pol, cfg.distributed.strategy)


def shard_problems(indices: list[int]) -> list[int]:
    """This rank's contiguous shard of the step's problem indices (all of them on one rank)."""
    return dp.shard(indices, dp.rank(), dp.world_size())


def gather_outcomes(outcomes: list[T]) -> list[T]:
    """All ranks' outcome matrices, in rank order (= the single-process problem order)."""
    if dp.world_size() == 1:
        return outcomes
    return [m for part in dp.all_gather_objects(outcomes) for m in part]


def local_part(items: list[T]) -> list[T]:
    """This rank's slice of a per-problem list built over all B problems."""
    return dp.shard(items, dp.rank(), dp.world_size())


_SUMMED = (
    "samples",
    "zero_variance_groups",
    "gate_rows",
    "sandbox/calls",
    "sandbox/programs",
    "sandbox/timeouts",
    "sandbox/infra_errors",
    "sandbox/infra_events",
    "sandbox/retries",
    "test/rejected/",
)


_POOLED = {"test/rejected_rate": "test/gate_rows", "sandbox/timeout_rate": "sandbox/calls"}
"""Rank-local rates and the counts they are rates of: pooled over ranks (weighted by the count), as one
process computes them over all of the step's problems."""


def reduce_row(local: dict[str, float], main_only: Any = ()) -> dict[str, float]:
    """Rank-local metrics over all ranks: counts summed, ``time/`` the slowest rank, rates pooled, the rest
    averaged.

    Keys in ``main_only`` (rank 0's validation) pass through unreduced; the order of ``local`` is kept.
    A key missing on a rank counts 0 there (``test/rejected/<reason>``). The rank-local rates of
    :data:`_POOLED` are weighted by their counts; the remaining averaged keys are equal on every rank (computed
    from the gathered outcomes), except ``sandbox/calls_per_s`` (the mean per-rank throughput).
    """
    if dp.world_size() == 1:
        return local
    shared = sorted(k for k in local if k not in main_only)
    keys = sorted({k for part in dp.all_gather_objects(shared) for k in part})  # the ranks' keys may differ
    weighted = [local.get(k, 0.0) * local.get(_POOLED[k], 0.0) for k in keys if k in _POOLED]
    values = [local.get(k, 0.0) for k in keys]
    reduced = dp.all_reduce(values + weighted)
    sums, pooled = reduced[: len(keys)], iter(reduced[len(keys) :])
    most = dp.all_reduce(values, op="max")
    world = dp.world_size()
    out = {}
    for k, s, m in zip(keys, sums, most, strict=True):
        out[k] = m if k.startswith("time/") else s if any(t in k for t in _SUMMED) else s / world
    for k in (k for k in keys if k in _POOLED):
        total = out.get(_POOLED[k], 0.0)
        out[k] = next(pooled) / total if total else 0.0
    return {**{k: out.get(k, v) for k, v in local.items()}, **out}


def null_tracker(cfg: Config, run_id: str | None = None, run_name: str | None = None) -> Any:
    """The tracker of ranks other than 0: records nothing anywhere (rank 0 owns the MLflow run)."""
    from tracking.runs import NullTracker

    return NullTracker()


_PEER_GONE = ("connection closed by peer", "connection reset", "timed out", "timeout", "broken pipe", "nccl")


def collective_failed(exc: BaseException) -> bool:
    """True when ``exc`` is a failed collective of a multi-rank run: ``DistBackendError`` (timeouts, a peer
    gone) or gloo's plain ``RuntimeError`` ("Connection closed by peer", "Timed out waiting ...")."""
    if dp.world_size() == 1:
        return False
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _PEER_GONE)


class PeersLost(UserError):
    """A collective of this rank failed: another rank died or hung (one line, :func:`rank_line`)."""


def run_ranks(cfg: Config, argv: list[str], main: Callable[[], Any], other: Callable[[], Any]) -> Any:
    """A stage's process under :func:`launch` (``nproc_per_node > 1``: re-executed under torchrun, its exit code
    raised): ``main()`` on rank 0, ``other()`` on the other ranks; a failed collective is one
    :class:`~flows.common.UserError` line (:func:`rank_line`)."""
    code = launch(cfg, argv)
    if code is not None:
        raise SystemExit(code)
    try:
        join(cfg)  # under torchrun: the process group, with the collective timeout
        try:
            return main() if is_main() else other()  # rank > 0: the same loop, no Prefect run or tracking
        except RuntimeError as exc:  # a rank died or hung past distributed.timeout_s: one line
            if not collective_failed(exc):
                raise
            raise PeersLost(rank_line(exc)) from None
    except Exception as exc:  # torchrun's launcher names the first failing rank with this line
        record_failure(exc)
        raise


def rank_line(exc: BaseException) -> str:
    """One line for a collective that failed (a rank died or hung past ``distributed.timeout_s``)."""
    return (
        f"train: rank {dp.rank()}/{dp.world_size()}: a collective failed ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0][:200] if str(exc) else 'no message'}): another rank died or hung past "
        "distributed.timeout_s; resume from the last checkpoint (any world size)"
    )


if __name__ == "__main__":  # the torchrun that launch() starts
    raise SystemExit(torchrun(sys.argv[1:]))
