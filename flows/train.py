"""The ``train`` stage: co-evolve the Code LLM and the Test LLM, one Prefect flow run per training run.

What it does: docs/method.md §3's loop, top to bottom, each step a named Prefect task run (``rollout_code[it=3]``
...): sample B problems, roll out code, roll out tests (white-box; black-box for ``selfplay``), gate them, replay
the Mistake Book, execute, score, update the book, build both GRPO batches (TOPVAR for the Test LLM), update both
policies, validate every ``eval.every`` steps, checkpoint atomically, log to MLflow. Modes (D10): ``codea1``,
``golden`` (golden tests, §7.4), ``selfplay`` (one model plays both roles, §18.2). ``resume: auto`` continues
from the last complete iteration with the same MLflow run; no step is logged twice.
What it does not: prepare data, warm-start, evaluate on the benchmarks (other stages); the process side is
apart: the run's state and the checks before the start ``flows/train_run.py``, task runs and SIGTERM
``flows/steps.py``, the lock and one-line errors ``flows/run_endings.py``, the console ``flows/console.py``, the
ranks ``flows/distributed.py``.

Outputs (``orchestration.checkpoint_dir``, default ``outputs/train``): ``checkpoints/`` (it_N + LATEST),
``mistake_book.json``, ``outcomes/it_N.parquet``, ``history.csv`` and ``metrics.json`` (derived from the
checkpointed history by :func:`finish`, idempotent: DVC deletes them before a re-run), ``final/{code,test}``.
These DVC outputs hold only what the run decides, so a second run of the same inputs writes the same bytes and
``dvc.lock`` stays as it is; beside them, not DVC outputs: ``timings.csv`` (the wall-clock values, per iteration;
also in MLflow) and ``mlflow_runs.json`` (the MLflow run of each config trained in the folder).

Run: ``python -m flows.train [--params params.yaml] [key=value ...]`` or ``codea1 train``; the same
``train_flow(params, overrides, run_dir)`` is the ``train/codea1-train`` deployment.
"""

from __future__ import annotations

if __name__ == "__main__":  # refused params: one line, before the imports below load Prefect and torch
    from flows.common import check_params_first

    check_params_first("train")

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.atomic import write_bytes_atomic, write_json_atomic
from codea1_core.config import Config
from codea1_core.method import batches
from codea1_core.models.loading import build_policy
from flows import console, run_endings, steps
from flows import distributed as dist_train
from flows.common import flow_config, flow_run_name, record_numerics, run_label, stage_config, stage_main
from flows.steps import as_function, as_task
from flows.train_run import TrainRun, load_problems, seed_everything, training_steps
from tasks.checkpoint import checkpoint
from tasks.execute import check_reference_health, execute, execute_golden
from tasks.mistake_book import merge_mistake_book, retrieve_replay
from tasks.overlap import execute_overlapped, gate_tests_overlapped, overlapped
from tasks.rollout import drop_overlong_problems, extract_codes, gate_tests, rollout_code, rollout_tests
from tasks.score import score, validate, write_outcomes
from tasks.tracking import log_iteration
from tasks.update import update_code, update_test
from tracking.results import record_run_id, recorded_run_id
from tracking.runs import make_tracker
from workspace import resume
from workspace.lock import WorkspaceLock

log = logging.getLogger("codea1.train")


# --------------------------------------------------------------------------------------------------
# The Prefect flow and the loop (the run's state: flows.train_run.TrainRun)
# --------------------------------------------------------------------------------------------------
@flow(name="train", flow_run_name=flow_run_name, log_prints=True)
def train_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, run_dir: str = ""
) -> dict[str, Any]:
    """Prefect entry point (DVC stage, CLI and the ``train/codea1-train`` deployment): a params file +
    ``key=value`` overrides (``mode=golden``, ...), trained into ``run_dir`` when given (``flows.common``)."""
    cfg = flow_config(params, overrides, run_dir)
    console.quiet_user_error_tracebacks()  # (also where a deployment runs this flow without the stage entry)
    record_numerics(cfg, "train")
    return run_endings.final_state(train(cfg))  # CANCELLED after SIGTERM


def train(cfg: Config) -> dict[str, Any]:
    """The training loop of §3 (runs inside :func:`train_flow`); ``{"stopped": True, ...}`` after SIGTERM."""
    from sandbox import make_executor

    # several ranks: rank 0 owns lock, tracking, checkpoints (flows/distributed.py)
    main = dist_train.is_main()
    lock = WorkspaceLock(cfg.orchestration.checkpoint_dir) if main else contextlib.nullcontext()
    with lock, steps.stop_on_sigterm() as stop, make_executor(cfg.sandbox) as executor:
        run = setup(cfg, make_tracker if main else dist_train.null_tracker, executor)
        run.stop = stop
        # the tracker's run ends with this block
        with run_endings.ending(run):
            if run.start == 0 and cfg.eval.every > 0 and run.val_set and main:  # validate first (§3 step 16)
                val = validate(run.code_pol, run.val_set, cfg, run.executor, 0)
                log_iteration(run.tracker, 0, {"iteration": 0, **val})
            # no per-iteration tag: a task run's tags make Prefect ask the server for their concurrency limits, a
            # write that waits out the client's back-off when SQLite is busy; the name ``<task>[it=N]`` is the view
            for it in range(run.start + 1, run.total + 1):
                iteration(run, it, as_task if main else as_function)
            dist_train.gather_for_save(run.policies.values())  # FSDP2: what rank 0 exports (every rank)
            run.summary = finish(run) if main else {}
    return run.summary


# --------------------------------------------------------------------------------------------------
# Before the first step: problems, resume state, tracker, policies, the Mistake Book
# --------------------------------------------------------------------------------------------------
def setup(cfg: Config, tracker_factory: Any, executor: Any) -> TrainRun:
    """Problems (a sample of references checked under the sandbox limits, before anything is created), resume
    state, tracker, policies (restored from the last checkpoint) and the Mistake Book."""
    from codea1_core.method.mistake_book import starting_book

    console.quiet_console()  # SyntaxWarnings of generated code, progress bars of every load and save
    out_dir = Path(cfg.orchestration.checkpoint_dir)
    train_set, val_set = load_problems(cfg)
    train_set, dropped = drop_overlong_problems(train_set, cfg)
    if dropped:
        log.warning(
            "train: %d problems dropped, code prompt > data.max_prompt_tokens=%d tokens (first: %s)",
            len(dropped),
            cfg.data.max_prompt_tokens,
            ", ".join(dropped[:5]),
        )
    total = training_steps(cfg, len(train_set))
    check_reference_health(executor, train_set, cfg, "train")  # limits that fail the references: one line
    fingerprint = batches.config_fingerprint(cfg.flat())
    state = resume.resume_or_start(out_dir, cfg.orchestration.resume, fingerprint, total, cfg.flat())
    run_id = recorded_run_id(out_dir, fingerprint) if state["continues"] else None
    tracker = tracker_factory(cfg, run_id=run_id, run_name=f"train-{run_label(cfg)}")
    # from here a failure ends the MLflow run FAILED (not RUNNING for good)
    with run_endings.failing(tracker):
        if dist_train.is_main():
            resume.save_run_info(out_dir, fingerprint, cfg.flat())
            record_run_id(out_dir, fingerprint, tracker.run_id)
        state["history"] = resume.with_timings(out_dir, state["history"])
        for row in state["history"]:  # backfill iterations checkpointed before a kill but not yet logged
            log_iteration.fn(tracker, int(row["iteration"]), row)
        seed_everything(cfg.seed)  # adapter initialisation is part of the run's identity
        policies = {"code": build_policy(cfg.model.code_path, cfg, "code", total)}
        if cfg.mode == "codea1":  # selfplay: one model plays both roles; golden: no Test LLM
            policies["test"] = build_policy(cfg.model.test_path, cfg, "test", total)
        # several ranks: DDP / FSDP2, before the checkpoint is restored
        dist_train.wrap_policies(policies, cfg)
        book = starting_book(cfg, state["book"])
        if state["path"] is not None:
            for role, pol in policies.items():
                pol.load(state["path"] / role)
    start = state["iteration"]
    where = f"resuming after iteration {start}" if start else "starting at iteration 1"
    log.info("train: mode=%s, %d problems, %d steps, %s", cfg.mode, len(train_set), total, where)
    return TrainRun(
        cfg,
        train_set,
        val_set,
        total,
        state["iteration"],
        fingerprint,
        policies,
        book,
        tracker,
        state["history"],
        out_dir,
        executor,
    )


# --------------------------------------------------------------------------------------------------
# One step: docs/method.md §3 steps 1-16
# --------------------------------------------------------------------------------------------------
def iteration(run: TrainRun, it: int, call: Any = as_task) -> dict[str, Any]:
    """One training step, docs/method.md §3 steps 1-16, each piece a task run named ``<task>[it=N]``."""
    from codea1_core.method.outcomes import plan_golden, plan_problem

    cfg, ex, times = run.cfg, run.executor, {}
    timed = steps.timed_steps(call, times, run.stop)  # time/<task>_s; SIGTERM stops before the next task
    golden, selfplay = cfg.mode == "golden", cfg.mode == "selfplay"

    t_iter = time.perf_counter()
    # step 1
    idx = batches.batch_indices(len(run.train_set), cfg.data.train_batch_size, cfg.data.seed, it - 1)
    idx = dist_train.shard_problems(idx)  # several ranks: this rank's shard (all of them on one)
    main = dist_train.is_main()
    problems = [run.train_set[i] for i in idx]
    code_out = timed("rollout_code", rollout_code, run.code_pol, problems, cfg, it)  # step 2
    codes = extract_codes(code_out)  # step 3
    metrics: dict[str, float] = {}
    test_out = test_batch = None
    if golden:  # §7.4: golden tests only, no Test LLM
        plans = [plan_golden(p, c) for p, c in zip(problems, codes, strict=True)]
        outcomes, sb = timed("execute", execute_golden, ex, plans, cfg, it)
        outcomes = dist_train.gather_outcomes(outcomes)  # all B problems on every rank
        scores, sm = timed("score", score, outcomes, cfg, it, golden=True)
        if main:  # a DVC out in all modes
            merge_mistake_book.fn(None, outcomes, it, run.out_dir / "mistake_book.json")
    else:
        args = (run.test_pol, problems, codes, cfg, it, selfplay)
        replay = retrieve_replay(run.book, problems, cfg)  # step 7, before this step's book update
        if cfg.rollout.overlap_execution:  # steps 6-8 run per problem while later problems generate
            with overlapped(ex, problems, codes, replay, cfg, it) as pipe:
                t_gen = time.perf_counter()
                test_out = timed("rollout_tests", rollout_tests, *args, on_chunk=pipe.take)  # steps 4-5
                pipe.generation_done(t_gen)
                suites, gate_m = timed("gate_tests", gate_tests_overlapped, pipe, it)  # step 6 + GX gate
                outcomes, sb = timed("execute", execute_overlapped, pipe, it)  # step 8
        else:
            test_out = timed(
                "rollout_tests", rollout_tests, *args
            )  # steps 4-5 (black-box prompts for selfplay)
            suites, gate_m = timed("gate_tests", gate_tests, problems, test_out, cfg, it)  # step 6 + GX gate
            plans = [plan_problem(*a) for a in zip(problems, codes, suites, replay, strict=True)]
            outcomes, sb = timed("execute", execute, ex, plans, cfg, it)  # step 8
        outcomes = dist_train.gather_outcomes(outcomes)  # all B problems, every rank: one book, global scores
        scores, sm = timed("score", score, outcomes, cfg, it)  # step 9
        book_path = run.out_dir / "mistake_book.json" if main else None
        book_m = timed("merge_mistake_book", merge_mistake_book, run.book, outcomes, it, book_path)
        metrics |= gate_m | book_m  # step 10
    scores = dist_train.local_part(scores)  # this rank's problems: its GRPO groups
    if not golden:
        groups, _ = batches.test_groups(test_out, scores, cfg.grpo.update_n)  # step 11: TOPVAR
        test_batch = batches.build_group_batch(groups, cfg.grpo)
    code_batch = batches.build_group_batch(batches.code_groups(code_out, scores), cfg.grpo)  # steps 12-14
    if selfplay:  # one model learns from both roles' samples in one step (§18.2)
        metrics |= timed("update_code", update_code, run.code_pol, code_batch.concat(test_batch), it)
    else:  # step 15: both policies update from the same rollouts
        metrics |= timed("update_code", update_code, run.code_pol, code_batch, it)
        if test_batch is not None:
            metrics |= timed("update_test", update_test, run.test_pol, test_batch, it)
    val: dict[str, float] = {}
    if cfg.eval.every > 0 and it % cfg.eval.every == 0 and run.val_set and main:  # step 16
        val = timed("validate", validate, run.code_pol, run.val_set, cfg, ex, it)
    times["time/iteration_s"] = time.perf_counter() - t_iter
    row = {"iteration": it, **dist_train.reduce_row({**metrics, **val, **sm, **sb, **times}, main_only=val)}
    run.history.append(row)  # recorded once, in the checkpoint's state (history.csv is derived at the end)
    dist_train.gather_for_save(run.policies.values())  # FSDP2: the checkpoint's state to rank 0 (every rank)
    if not main:  # rank 0 alone writes, checkpoints and logs (flows/distributed.py)
        return row
    parquet = write_outcomes(run.out_dir / "outcomes" / f"it_{it:06d}.parquet", outcomes)
    # wall-clock values stay out of the checkpoint (a DVC output): timings.csv and MLflow keep them
    state = {"fingerprint": run.fingerprint, "history": [resume.without_timings(r) for r in run.history]}
    book_out = run.out_dir / "mistake_book.json"  # merge_mistake_book wrote it: the step's one serialisation
    book = str(book_out) if run.book is not None else None  # the checkpoint copies its bytes
    call(checkpoint, str(run.out_dir), it, run.policies, book, state, cfg.orchestration.keep_checkpoints)
    resume.write_timings(run.out_dir, run.history)
    samples = batches.sample_rows(problems, code_out, test_out, scores, cfg.tracking.log_samples)
    files = {"outcomes": str(parquet), "mistake_book": str(book_out)}
    call(log_iteration, run.tracker, it, row, samples, files)
    # log_prints: the console and Prefect's logs
    print(console.progress_line(it, run.total, row, run.history))
    return row


# --------------------------------------------------------------------------------------------------
# After the last step: the stage's outputs, export and registration
# --------------------------------------------------------------------------------------------------
def fault_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``$CODEA1_KILL_AT`` says so (tests/flows/test_wedge.py)."""
    if os.environ.get("CODEA1_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def finish(run: TrainRun) -> dict[str, Any]:
    """Every output of the stage from the last checkpoint, the final policies exported and registered. Idempotent
    and safe to kill anywhere (DVC deletes non-persistent outs before a re-run, so a resumed run with no step left
    rewrites them; registration reuses this run's version: one model version per completed run)."""
    from codea1_core.evaluation.report import training_chart
    from codea1_core.method.mistake_book import MistakeBook

    final = run.out_dir / "final"
    done = final / "DONE.json"
    summary = resume.write_history(run.out_dir, run.history)
    book = run.book if run.book is not None else MistakeBook(enabled=False)
    write_json_atomic(run.out_dir / "mistake_book.json", book.to_dict(), fsync=True)
    fault_point("finish:history")
    exported = all((final / role).is_dir() for role in run.policies)
    if exported and resume.done_matches(done, run.total, run.fingerprint):
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
    # the run id stays out of this DVC output: tracking.results.RUNS_FILE maps the fingerprint to it
    write_json_atomic(
        done, {"iteration": run.total, "versions": versions, "fingerprint": run.fingerprint}, fsync=True
    )
    fault_point("finish:done")
    return summary


# --------------------------------------------------------------------------------------------------
# DVC / CLI entry point
# --------------------------------------------------------------------------------------------------
def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """DVC/CLI entry point (``flows.common.stage_main``): :func:`train_flow` under the lock, after the checks
    (``flows.run_endings.run_guarded``), with the same ``params`` and ``overrides``."""
    overrides = list(overrides or [])
    cfg = stage_config(params, overrides)
    return dist_train.run_ranks(  # nproc_per_node > 1: under torchrun; rank > 0: the loop, no Prefect or tracking
        cfg,
        ["--params", params, *overrides],
        main=lambda: run_endings.run_guarded(cfg, lambda: train_flow(params=params, overrides=overrides)),
        other=lambda: train(flow_config(params, overrides)),
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run, "Co-evolution training (Code-A1)"))
