"""Data-parallel training on torch.distributed (``codea1_core/models/distributed.py``), on CPU with gloo.

The update check: ``torchrun --nproc-per-node 2`` runs one GRPO step of both roles on a fixed batch of 4
problems sharded over 2 ranks, for full fine-tuning and LoRA, with DDP and with FSDP2
(``tests/distributed_worker.py``); rank 0 then runs the same steps in one process. Every trained parameter
and the step's metrics (the pre-clip gradient norm included: AdamW and clipping are scale-invariant, the norm
is not) must agree within 1e-5 relative. It fails when the loss denominator is the rank's own token count
instead of the global one, when the x W for the averaging of DDP/FSDP2 is missing, or when the mini-batches
are the ranks' own slices instead of slices of the global sample order.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codea1_core.models import distributed as dp

ROOT = Path(__file__).resolve().parents[2]


def test_shard_is_contiguous_equal_and_checked():
    items = list(range(8))
    assert [dp.shard(items, r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sum((dp.shard(items, r, 4) for r in range(4)), []) == items
    with pytest.raises(ValueError, match="train_batch_size=8 is not divisible by the world size 3"):
        dp.shard(items, 0, 3)


def test_single_process_helpers_are_identities():
    assert dp.world_size() == 1 and dp.rank() == 0 and dp.is_main()
    assert dp.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert dp.all_reduce([1.5, 2.0]) == [1.5, 2.0]
    assert dp.init_from_env() is False  # outside torchrun: nothing to join


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.fixture(scope="module")
def two_rank_steps(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("dp")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "tests" / "distributed_worker.py"),
        str(tiny_model_dir),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.e2e  # torchrun (two_rank_steps)
@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("role", ["code", "test"])
def test_two_rank_update_equals_single_process(two_rank_steps, finetune, strategy, role):
    two = torch.load(two_rank_steps / f"{finetune}-{strategy}-{role}-w2.pt")
    one = torch.load(two_rank_steps / f"{finetune}-{strategy}-{role}-w1.pt")
    assert two["params"].keys() == one["params"].keys() and one["params"]
    moved = [k for k in one["params"] if _rel(one["params"][k], one["before"][k]) > 1e-5]
    assert len(moved) >= len(one["params"]) - 1, set(one["params"]) - set(moved)  # not a vacuous equality
    rel = {k: _rel(two["params"][k], one["params"][k]) for k in one["params"]}
    # The key bias has an identically zero true gradient (softmax is invariant to a shift of all keys): its
    # gradient is float rounding noise, which AdamW's first steps turn into +-lr moves in ANY change of summation
    # order. Every other parameter is within 1e-5; the key bias stays bounded.
    noise = {k for k in rel if k.endswith("k_proj.bias")}
    worst = max(set(rel) - noise, key=rel.get)
    assert rel[worst] <= 1e-5, (worst, rel[worst])
    assert all(rel[k] <= 1e-3 for k in noise), {k: rel[k] for k in noise}
    for key in ("loss", "pg_loss", "kl", "grad_norm", "tokens", "entropy"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7), key


def _worst(two: dict, one: dict) -> tuple[str, float]:
    """The largest relative difference of a parameter (the key bias's rounding noise aside: see above)."""
    rel = {k: _rel(two[k], one[k]) for k in one}
    assert rel and all(rel[k] <= 1e-3 for k in rel if k.endswith("k_proj.bias")), rel
    return max(((k, r) for k, r in rel.items() if not k.endswith("k_proj.bias")), key=lambda kr: kr[1])


@pytest.mark.e2e  # torchrun (two_rank_steps)
@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("role", ["code", "test"])
def test_fsdp2_samples_checkpoints_and_resumes_like_one_process(two_rank_steps, finetune, role):
    """FSDP2 in the training flow: after the update both ranks sample what one process samples (from the whole
    copy, refreshed after the update: stale weights would sample the untrained model's tokens); the checkpoint,
    gathered to rank 0, restores into a fresh sharded policy whose next step equals one process's, and restores
    in one process too (2 -> 1: the same format), with the optimizer state (AdamW's moments move the next step)."""
    two = torch.load(two_rank_steps / f"{finetune}-fsdp2-{role}-w2.pt")
    one = torch.load(two_rank_steps / f"{finetune}-fsdp2-{role}-w1.pt")

    def same(a: dict, b: dict) -> bool:  # the same tokens, log-probs within rounding
        close = [
            math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5)
            for u, v in zip(a["logprobs"], b["logprobs"], strict=True)
            for x, y in zip(u, v, strict=True)
        ]
        return a["tokens"] == b["tokens"] and all(close)

    assert all(one["sampled"]["tokens"])
    assert not same(one["sampled"], one["sampled_before"])  # the update shows in what is sampled
    assert same(two["sampled"], one["sampled"])
    assert same(two["resumed_sampled"], one["resumed_sampled"])
    assert same(one["from_w2_sampled"], one["resumed_sampled"])
    assert min(_rel(one["resumed"][k], one["params"][k]) for k in one["params"]) > 1e-5  # the step moved them
    assert _worst(two["resumed"], one["resumed"])[1] <= 1e-5
    assert _worst(one["from_w2"], one["resumed"])[1] <= 1e-5


@pytest.mark.e2e  # torchrun (two_rank_steps)
def test_rank_local_rates_are_pooled_as_one_process_computes_them(two_rank_steps):
    """A rate each rank computes over its own items (the gate's rejections, the sandbox's timeouts) is the rate
    over all of them: weighted by its count, not the mean of the ranks' rates (0.3 and 0.1 here)."""
    row = torch.load(two_rank_steps / "row-w2.pt")
    assert row["test/rejected_rate"] == pytest.approx((0.5 * 2 + 0.1 * 10) / 12)
    assert row["sandbox/timeout_rate"] == pytest.approx(1 / 15)
    assert row["test/gate_rows"] == 12 and row["sandbox/calls"] == 15
    assert row["code/reward_mean"] == 0.25 and row["time/execute_s"] == 3.0


@pytest.mark.e2e  # torchrun (two_rank_steps)
def test_two_rank_mistake_book_equals_single_process(two_rank_steps):
    """One book, the same entries as one process: each rank's outcomes are gathered before the update (a rank
    merging only its own shard would miss the other shard's problems, which recur on it in later steps)."""
    two, one = torch.load(two_rank_steps / "book-w2.pt"), torch.load(two_rank_steps / "book-w1.pt")
    assert sum(len(v) for v in one["problems"].values()) >= 6  # a real book: entries on several problems
    assert two == one


def test_memory_plan_per_rank_for_the_7b_recipe_on_8_gpus():
    """``codea1 plan --gpus 8``: FSDP2 shards the trained weights, gradients and AdamW state; DDP does not."""
    import json

    from codea1_core.config import load_config
    from codea1_core.models.memory_plan import ModelShape, estimate, verdict

    cfg = load_config(ROOT / "configs" / "qwen2.5-coder-7b.yaml", [])
    shape = ModelShape.from_hf_config(
        json.loads((ROOT / "configs" / "qwen2.5-coder-7b.config.json").read_text())
    )
    one = estimate(cfg, shape, 141.0)
    ddp = estimate(cfg, shape, 141.0, ranks=8, strategy="ddp")
    fsdp = estimate(cfg, shape, 141.0, ranks=8, strategy="fsdp2")
    assert ddp.total == one.total
    for part in ("weights", "gradients", "optimizer"):
        assert fsdp.parts[part] == pytest.approx(one.parts[part] / 8)
    assert fsdp.parts["reference"] == one.parts["reference"]  # the frozen reference stays whole on every rank
    assert verdict(cfg, shape, 141.0, ranks=8, strategy="fsdp2")[0]
    ok, line = verdict(cfg, shape, 141.0, ranks=8, strategy="ddp")
    assert not ok and line.endswith("set distributed.strategy=fsdp2")
