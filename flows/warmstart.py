"""The ``warmstart`` stage: a tiny model, built locally and supervised-fine-tuned into both roles.

What it does: trains a BPE tokenizer and a random-init tiny Qwen2 model on the lab's text
(``codea1_core.data.warmstart_data.tokenizer_corpus``), then fine-tunes it (TRL SFT) into the Code LLM (correct
and buggy solutions, ``lab.buggy_fraction``, on the training problems plus fresh parameter sets up to
``lab.warmstart_code_problems_per_family``, so it learns to copy constants rather than memorize them) and
the Test LLM (imperfect white-box test suites on the training problems), so RL has room to improve both.
``selfplay`` mode trains one model on code and black-box test conversations; ``golden`` mode trains only
the Code LLM. Everything is written to a temporary folder and moved into
``outputs/warmstart/`` (``base``, the role folders named by ``model.code_path`` / ``model.test_path``,
``metrics.json``) in one rename. ``metrics.json`` holds only what the build decides (sizes, losses, counts), so
the same warm start built twice gives the same bytes and the same DVC hash; its wall-clock seconds go to
``outputs/timings/warmstart.json`` (:func:`timings_path`), outside every DVC output. Each model folder gets a
``MANIFEST.json`` (size and sha256 of its files, ``workspace.checkpoints``) that training verifies when it
starts or resumes. Building the base and
each role's fine-tuning are task runs (``build_base``, ``sft[<role>]``: ``tasks/warmstart.py``).
What it does not: touch user models. When ``model.code_path`` (and ``test_path``) are not inside
``outputs/warmstart/`` (e.g. ``Qwen/Qwen2.5-Coder-1.5B-Instruct``), it only writes a ``metrics.json``
saying it was skipped.

Run: ``python -m flows.warmstart [--params params.yaml] [key=value ...]`` or ``codea1 warmstart``.
"""

from __future__ import annotations

if __name__ == "__main__":  # refused params: one line, before the imports below load Prefect and torch
    from flows.common import check_params_first

    check_params_first("warmstart")

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.atomic import DISK_ERRNOS, disk_error, replace_dir, temp_dir_for, write_json_atomic
from codea1_core.config import Config
from codea1_core.types import Problem
from flows.common import (
    UserError,
    flow_config,
    flow_run_name,
    record_numerics,
    stage_config,
    stage_main,
    stage_task,
)
from tasks.warmstart import build_base, sft
from workspace.checkpoints import write_manifest
from workspace.resume import is_timing

log = logging.getLogger("codea1.warmstart")

WARMSTART_DIR = Path("outputs/warmstart")
"""Stage output folder (relative to the working directory, like every DVC out)."""


def role_dirs(cfg: Config, root: Path = WARMSTART_DIR) -> dict[str, Path]:
    """Roles to warm-start and their folder relative to ``root``; roles pointing elsewhere are left out."""
    wanted = {"codea1": ("code", "test"), "golden": ("code",), "selfplay": ("code",)}[cfg.mode]
    paths = {"code": cfg.model.code_path, "test": cfg.model.test_path}
    dirs = {}
    for role in wanted:
        path = Path(paths[role]).expanduser().resolve()
        if path.is_relative_to(root.resolve()) and path != root.resolve():
            dirs[role] = path.relative_to(root.resolve())
    return dirs


def training_problems(cfg: Config) -> list[Problem]:
    """Lab problems of the prepared training set when there is one, else generated (same seed, same set)."""
    from codea1_core.data.lab import lab_problems

    prepared = Path(cfg.data.prepared_dir) / "train.parquet"
    if prepared.is_file():
        try:
            from codea1_core.data.prepared import load_prepared
        except ImportError:  # the prepared-set reader is optional here: the lab problems are regenerable
            load_prepared = None
        if load_prepared is not None:
            lab = [p for p in load_prepared(prepared) if p.source == "lab"]
            if lab:
                return lab
    return lab_problems(cfg.lab, "train")


def _write_metrics(path: Path, metrics: dict[str, Any]) -> None:
    write_json_atomic(path, metrics, indent=2, default=None, newline=True)


def timings_path(root: Path = WARMSTART_DIR) -> Path:
    """Where the warm start's wall-clock seconds go: beside the stage's output, not inside it (a DVC output
    holding a timing would change its hash on every run of the same build)."""
    return root.parent / "timings" / "warmstart.json"


def _param_count(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    return sum(p.numel() for p in model.parameters())


def warm_start(cfg: Config, root: Path = WARMSTART_DIR) -> dict[str, Any]:
    """Build the tiny base model and fine-tune each role; returns the metrics written to ``metrics.json`` and
    the timings written to :func:`timings_path`."""
    from codea1_core.data.lab import warmstart_code_problems
    from codea1_core.data.warmstart_data import warmstart_examples

    t0 = time.perf_counter()
    dirs = role_dirs(cfg, root)
    lab, k = cfg.lab, cfg.reward.k
    tmp = temp_dir_for(root)  # built whole, then swapped in: a failed run leaves the previous outputs
    shutil.rmtree(tmp, ignore_errors=True)
    if not dirs:  # user models: nothing to build; stale tiny models must not linger beside this verdict
        metrics = {
            "skipped": True,
            "reason": f"model.code_path/test_path are not inside {root}",
            "code_path": cfg.model.code_path,
            "test_path": cfg.model.test_path,
        }
        _write_metrics(tmp / "metrics.json", metrics)
        replace_dir(tmp, root)
        return metrics
    try:
        base = stage_task(build_base, cfg, tmp / "base")
        t_base = time.perf_counter() - t0
        problems = training_problems(cfg)
        metrics: dict[str, Any] = {
            "skipped": False,
            "n_problems": len(problems),
            "time/base_s": t_base,
            "param_count": _param_count(base),
            "mode": cfg.mode,
        }
        for role, rel in dirs.items():
            t_role = time.perf_counter()
            role_problems = warmstart_code_problems(lab, problems) if role == "code" else problems
            examples = warmstart_examples(role_problems, role, lab, cfg.seed, k=k)
            if cfg.mode == "selfplay":  # one model plays both roles with black-box test prompts (D10)
                examples += warmstart_examples(problems, "test", lab, cfg.seed, k=k, blackbox=True)
            stats = stage_task(sft, cfg, role, base, examples, tmp / rel)
            metrics[f"{role}/n_examples"] = len(examples)
            metrics |= {f"{role}/{key}": v for key, v in stats.items() if isinstance(v, int | float | str)}
            metrics[f"time/sft_{role}_s"] = time.perf_counter() - t_role
        for folder in (base, *(tmp / rel for rel in dirs.values())):  # verified when training starts
            write_manifest(Path(folder))
        metrics["time/total_s"] = time.perf_counter() - t0
        _write_metrics(tmp / "metrics.json", {k: v for k, v in metrics.items() if not is_timing(k)})
        replace_dir(tmp, root)
        _write_metrics(timings_path(root), {k: v for k, v in metrics.items() if is_timing(k)})
    except Exception as exc:
        disk = disk_error(exc, root.parent)  # before the cleanup: a probe write into the same, full disk
        shutil.rmtree(tmp, ignore_errors=True)
        if disk is not None:  # torch and safetensors raise their own errors on a full disk
            raise disk from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return metrics


@flow(name="warmstart", flow_run_name=flow_run_name)  # no log_prints: datasets prints dis() into stdout
def warmstart_flow(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """Prefect entry point (DVC stage and CLI): a params file + ``key=value`` overrides."""
    cfg = flow_config(params, overrides)
    record_numerics(cfg, "warmstart")
    return warm_start(cfg)


def summary_line(metrics: dict[str, Any]) -> str:
    """One line for the terminal: what was built, the final losses, how long it took."""
    if metrics["skipped"]:
        return f"warmstart: skipped ({metrics['reason']})"
    losses = ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if k.endswith("_loss"))
    return (
        f"warmstart: {metrics['param_count']:,} params, {metrics['n_problems']} problems, {losses}, "
        f"{metrics['time/total_s']:.0f} s -> {WARMSTART_DIR}/"
    )


def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """DVC/CLI entry point (``flows.common.stage_main``): run the flow, print a summary."""
    from codea1_core.data.lab import check_lab_config
    from flows.console import quiet_user_error_tracebacks

    cfg = stage_config(params, overrides)
    if role_dirs(cfg):
        check_lab_config(cfg.lab)  # a bad lab.* value: one line before any Prefect run starts
    quiet_user_error_tracebacks()  # a full disk: the line below, not Prefect's traceback
    try:
        metrics = warmstart_flow(params=params, overrides=list(overrides or []))
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        raise UserError(
            f"{exc.filename or WARMSTART_DIR}: {exc.strerror}: the warm start was not written (the previous "
            "one is kept); free space there, then rerun it"
        ) from None
    print(summary_line(metrics))
    return metrics


if __name__ == "__main__":
    raise SystemExit(stage_main(run, "Warm start of the tiny lab models (SFT)"))
