"""``codea1 plan``: the estimated peak GPU memory of a training config, and whether it fits 80 / 141 GB GPUs.

What it does: finds the policies' architecture (``config.json`` of ``model.code_path`` when it is a local
folder; the copy in ``configs/`` for the hub ids we ship, e.g. ``Qwen/Qwen2.5-Coder-1.5B-Instruct``; else
transformers' ``AutoConfig`` from the local HF cache), runs :mod:`codea1_core.models.memory_plan` and prints
the parts, the total and one verdict line per GPU. :func:`check_training_fits` is the train-start check:
on CUDA (or with ``model.gpu_memory_gb`` set) a config that cannot fit stops with one line naming the
key to change; on CPU with the default ``gpu_memory_gb: 0`` it does nothing.
What it does not: load weights or touch a GPU (beyond reading its size for the train-start check).

Run: ``codea1 plan --params configs/qwen2.5-coder-1.5b.yaml [--gpu-gb 80] [key=value ...]``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from codea1_core.config import Config
from codea1_core.models.memory_plan import GPU_SIZES_GB, ModelShape, estimate, verdict
from flows.common import UserError, load_stage_config, run_user_errors

log = logging.getLogger("codea1.plan")

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
SHIPPED_SHAPES = {
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": "qwen2.5-coder-1.5b.config.json",
    "Qwen/Qwen2.5-Coder-1.5B": "qwen2.5-coder-1.5b.config.json",
    "Qwen/Qwen2.5-Coder-7B-Instruct": "qwen2.5-coder-7b.config.json",
    "Qwen/Qwen2.5-Coder-7B": "qwen2.5-coder-7b.config.json",
}
"""Hub ids whose ``config.json`` is kept in ``configs/`` (no download needed to plan them)."""


def model_shape(path: str, key: str = "model.code_path") -> ModelShape:
    """The architecture of ``path`` (a local model folder or a hub id); a UserError naming ``key`` if unknown."""
    local = Path(path) / "config.json"
    if local.is_file():
        return _shape_from_file(local)
    if path in SHIPPED_SHAPES:
        return _shape_from_file(CONFIGS_DIR / SHIPPED_SHAPES[path])
    try:
        from transformers import AutoConfig

        raw = AutoConfig.from_pretrained(path).to_dict()
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{key}: cannot read the architecture of {path!r} ({first})") from None
    try:
        return ModelShape.from_hf_config(raw, f"{path} config")
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _shape_from_file(path: Path) -> ModelShape:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable JSON model config ({exc})") from None
    try:
        return ModelShape.from_hf_config(raw, str(path))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def plan_report(cfg: Config, gpu_sizes: tuple[float, ...], gpus: int = 1) -> tuple[list[str], bool]:
    """The printed report (parts of the first size's plan, then one verdict per size) and whether all fit.

    ``gpus`` > 1: the plan is per rank of a data-parallel run with ``distributed.strategy``, followed by the
    verdicts of both strategies (which one fits, per rank)."""
    shape = model_shape(cfg.model.code_path)
    strategy = cfg.distributed.strategy
    plan = estimate(cfg, shape, gpu_sizes[0], ranks=gpus, strategy=strategy)
    where = "one GPU" if gpus == 1 else f"per rank of {gpus} GPUs, distributed.strategy={strategy}"
    lines = [f"memory plan for {cfg.model.code_path} (mode {cfg.mode}, peak of a training step, {where}):"]
    lines += plan.table()
    verdicts = [verdict(cfg, shape, size, ranks=gpus, strategy=strategy) for size in gpu_sizes]
    lines += [line for _, line in verdicts]
    if gpus > 1:
        for other in ("ddp", "fsdp2"):
            if other != strategy:
                lines += [
                    f"with distributed.strategy={other}: {line}"
                    for _, line in (
                        verdict(cfg, shape, size, ranks=gpus, strategy=other) for size in gpu_sizes
                    )
                ]
    return lines, all(ok for ok, _ in verdicts)


def _gpu_gb(cfg: Config) -> float:
    """GPU size to check at train start: ``model.gpu_memory_gb``, else the CUDA device's, else 0 (no check)."""
    if cfg.model.gpu_memory_gb > 0:
        return cfg.model.gpu_memory_gb
    import torch

    device = cfg.model.device
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if not wants_cuda or not torch.cuda.is_available():
        return 0.0
    index = torch.device(device).index if device.startswith("cuda:") else 0
    return torch.cuda.get_device_properties(index or 0).total_memory / 1e9


def check_training_fits(cfg: Config) -> None:
    """Stop a training run that cannot fit its GPU with one line naming the key to change (see module doc)."""
    gpu_gb = _gpu_gb(cfg)
    if gpu_gb <= 0:
        return
    try:
        shape = model_shape(cfg.model.code_path)
    except UserError as exc:  # an unknown architecture must not block training: the plan is advisory
        log.warning("memory plan skipped: %s", exc)
        return
    ok, line = verdict(cfg, shape, gpu_gb)
    if not ok:
        raise UserError(f"memory plan: {line}")
    log.info("memory plan: %s", line)


def main(argv: list[str] | None = None) -> int:
    """``codea1 plan``: exit 0 when the config fits every GPU asked about, 1 when not, 2 on user errors."""
    parser = argparse.ArgumentParser(
        prog="codea1 plan", description="Estimate the peak GPU memory of a training config."
    )
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument(
        "--gpu-gb",
        type=float,
        action="append",
        default=None,
        help="GPU memory in GB (repeatable; default: 80 and 141)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPUs of a data-parallel run: the plan per rank (DDP and FSDP2 verdicts)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    fits = [True]

    def go() -> None:
        cfg = load_stage_config(args.params, list(args.overrides))
        sizes = tuple(args.gpu_gb) if args.gpu_gb else GPU_SIZES_GB
        if any(s <= 0 for s in sizes):
            raise UserError(f"--gpu-gb: expected a positive size in GB, got {min(sizes)}")
        if args.gpus < 1:
            raise UserError(f"--gpus: expected >= 1, got {args.gpus}")
        lines, fits[0] = plan_report(cfg, sizes, args.gpus)
        print("\n".join(lines))

    rc = run_user_errors(go)
    return rc if rc else (0 if fits[0] else 1)


if __name__ == "__main__":
    raise SystemExit(main())
