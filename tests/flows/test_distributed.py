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


# --------------------------------------------------------------------------------------------------
# How a multi-rank run ends: one line, the failing rank's own, resume advice only where a rerun can help
# --------------------------------------------------------------------------------------------------
_RANKS_SCRIPT = """
import sys, time
from codea1_core.config import Config
from flows import distributed as d
from flows.common import UserError, run_user_errors
cfg = Config().replace(**{"distributed.nproc_per_node": 2, "data.train_batch_size": 4})
def main():
    time.sleep(60)  # torchrun stops it when rank 1 fails
def other():
    raise UserError("data.widgets=3: no such key, remove it")
sys.exit(run_user_errors(lambda: d.run_ranks(cfg, [], main, other)))
"""


@pytest.mark.e2e  # torchrun
def test_a_rank_user_error_ends_the_run_with_that_rank_line_and_no_torchrun_traceback(tmp_path):
    """Regression: a rank's one-line error was followed by torchrun's ChildFailedError traceback and failure
    table (~30 lines), then "run the same command again to resume", which fails the same way."""
    from codea1_core.config import Config
    from flows import distributed as dist_train

    script = tmp_path / "ranks.py"
    script.write_text(_RANKS_SCRIPT)
    failure_file = tmp_path / "failure.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), dist_train.FAILURE_FILE_ENV: str(failure_file)}
    cmd = [sys.executable, "-m", "flows.distributed", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    import json

    failure = json.loads(failure_file.read_text())
    assert (failure["rank"], failure["kind"], failure["exitcode"]) == (1, "user", 2)
    cfg = Config().replace(**{"distributed.nproc_per_node": 2, "orchestration.checkpoint_dir": str(tmp_path)})
    assert dist_train.stopped_line(cfg, proc.returncode, failure) == (
        "train: stopped (torchrun exit 1): rank 1/2: data.widgets=3: no such key, remove it"
    )


def test_a_dead_or_hung_rank_names_the_rank_and_the_checkpoint_to_resume_from(tmp_path):
    from codea1_core.config import Config
    from flows import distributed as dist_train

    cfg = Config().replace(
        **{
            "distributed.nproc_per_node": 2,
            "distributed.timeout_s": 30.0,
            "orchestration.checkpoint_dir": str(tmp_path),
        }
    )
    died = {"rank": 1, "exitcode": -9, "signal": "SIGKILL", "kind": None, "message": None}
    assert dist_train.stopped_line(cfg, 1, died) == (
        "train: stopped (torchrun exit 1): rank 1/2 died (SIGKILL); no checkpoint was written yet; "
        "run the same command again to resume, at any distributed.nproc_per_node"
    )
    hung = {"rank": 0, "exitcode": 2, "signal": None, "kind": "collective", "message": "train: rank 0/2: ..."}
    assert dist_train.stopped_line(cfg, 1, hung).startswith(
        "train: stopped (torchrun exit 1): rank 0/2 lost its peers: a rank died or hung past "
        "distributed.timeout_s=30; no checkpoint was written yet; run the same command again to resume"
    )


@pytest.mark.e2e  # the train stage in a subprocess
def test_a_step_budget_below_the_workspace_checkpoint_is_one_line_before_any_rank_starts(tmp_path):
    """Regression: after `make run` (checkpoint 95), `codea1 train distributed.nproc_per_node=2
    orchestration.max_steps=2` buried rank 0's one line in ~80 lines of tracebacks (rank 1's, torchrun's) and
    ended with "run the same command again to resume"."""
    import yaml

    from codea1_core.config import Config
    from codea1_core.method import batches
    from workspace import checkpoints, resume

    class _Weights:
        def save(self, folder: Path) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "weights.bin").write_bytes(b"w" * 64)

    out = tmp_path / "train"
    cfg = Config().replace(
        **{
            "orchestration.checkpoint_dir": str(out),
            "orchestration.max_steps": 5,
            "tracking.backend": "null",
            "data.prepared_dir": str(tmp_path / "prepared"),
            "data.train_sources": ["lab"],
            "data.train_batch_size": 4,
            "rollout.max_new_tokens_code": 96,  # within the lab model's 1,024-token context
            "rollout.max_new_tokens_test": 128,
        }
    )
    fp = batches.config_fingerprint(cfg.flat())
    resume.save_run_info(out, fp, cfg.flat())
    for it in range(1, 6):
        state = {"fingerprint": fp, "history": [{"iteration": i} for i in range(1, it + 1)]}
        checkpoints.save_checkpoint(out, it, {"code": _Weights()}, None, state, keep=2)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    cmd = [sys.executable, "-m", "flows.train", "--params", str(params)]
    cmd += ["distributed.nproc_per_node=2", "orchestration.max_steps=2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "pf")}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "torchrun exit" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: orchestration.max_steps=2 is below the last checkpoint's iteration 5"), (
        last
    )
    assert "orchestration.checkpoint_dir to another folder" in last
    assert (out / "checkpoints" / "it_000005").is_dir()


def test_ddp_wrapping_uses_no_deprecated_argument(tmp_path):
    """Regression: ``broadcast_buffers=False`` printed torch's FutureWarning on every rank of every distributed
    run; the wrap must not warn (a one-rank gloo group is enough to build the DDP module)."""
    import types
    import warnings

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        policy = types.SimpleNamespace(
            model=torch.nn.Linear(2, 2),
            device=torch.device("cpu"),
            logprob_forward=lambda: lambda model, x: model(x),
            rebuild_optimizer=lambda: None,
        )
        policy.model.register_buffer("table", torch.ones(2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the wrap
            dp.wrap_policy(policy, "ddp")
        assert isinstance(policy.dist_module, torch.nn.parallel.DistributedDataParallel)
        assert policy.dist_module.forward_sync_buffers is False
    finally:
        dist.destroy_process_group()
