"""A short lab run in its own process, for ``tests/flows/test_cpu_numerics.py``: prints the numbers it produced as JSON.

``python tests/numerics_probe.py WORKDIR PREPARED_DIR [key=value ...]`` runs, in ``WORKDIR``, the warm start
(a tiny lab model, one SFT epoch), 2 training steps and the evaluation — the real stage flows, as ``dvc repro``
runs them — on the prepared sets in ``PREPARED_DIR`` (prepared first when absent), then prints one JSON line:
the SHA-256 of every trained
weight file, the warm start's losses, the training history and every evaluation metric. Timings are left out:
everything printed is decided by the seed and the CPU kernels. A config the stages refuse exits 2 with the
stage's one-line error on stderr, as the stages do.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from pathlib import Path

import flows  # noqa: F401  (first: the process defaults, before torch loads)

TINY = [
    "lab.train_per_family=1",
    "lab.heldout_per_family=1",
    "lab.hidden_size=32",
    "lab.num_layers=1",
    "lab.num_heads=2",
    "lab.intermediate_size=64",
    "lab.vocab_size=512",
    "lab.warmstart_epochs=1",
    "lab.warmstart_code_epochs=1",
    "lab.warmstart_code_problems_per_family=1",
    "lab.warmstart_batch_size=4",
    "data.train_batch_size=2",
    "rollout.n_code=2",
    "rollout.n_tests=2",
    "rollout.max_new_tokens_code=24",
    "rollout.max_new_tokens_test=24",
    "orchestration.max_steps=2",
    "grpo.warmup_steps=1",
    "eval.n_samples=4",
    "eval.k_list=[1]",
    "eval.max_new_tokens=24",
    "eval.every=0",
    "eval.max_mutants=2",
    "eval.baseline=false",
    "tracking.backend=null",
    "sandbox.workers=1",
]
"""The short run: one problem per lab family, a 32-wide one-layer model, a few SFT steps, 2 GRPO steps of 2
problems, a 4-sample evaluation."""


def _clock(key: str) -> bool:
    """Keys that measure time (wall-clock seconds, throughput), not numbers the seed decides."""
    return key.startswith("time/") or key.endswith(("seconds", "_s", "per_s"))


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(folder.rglob("*.safetensors"))
    }


def main(argv: list[str]) -> int:
    from flows.common import run_user_errors
    from flows.evaluate import evaluate_flow
    from flows.prepare import prepare_flow
    from flows.train import train_flow
    from flows.warmstart import warmstart_flow

    workdir, prepared, extra = Path(argv[0]), argv[1], argv[2:]
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    overrides = [*TINY, f"data.prepared_dir={prepared}", *extra]
    params = Path(__file__).resolve().parents[1] / "params.yaml"
    out: dict = {}

    def go() -> None:
        warm = warmstart_flow(params=str(params), overrides=overrides)
        out["warmstart"] = {k: v for k, v in warm.items() if not _clock(k)}
        train_flow(params=str(params), overrides=overrides)
        with open("outputs/train/history.csv", newline="") as f:
            out["history"] = [{k: v for k, v in row.items() if not _clock(k)} for row in csv.DictReader(f)]
        out["eval"] = {
            k: v for k, v in evaluate_flow(params=str(params), overrides=overrides).items() if not _clock(k)
        }
        out["weights"] = _digest(Path("outputs"))
        out["numerics"] = json.loads(Path("outputs/numerics/train.json").read_text())

    def prepare_once() -> (
        None
    ):  # the same bytes every time (tests/flows/test_prepare_bytes.py): shared by the runs
        if not (Path(prepared) / "train.parquet").is_file():
            prepare_flow(params=str(params), overrides=overrides)
        go()

    code = run_user_errors(prepare_once)
    if code == 0:
        print(json.dumps(out, sort_keys=True, default=str))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
