"""The memory plan: the estimator against measured CPU memory, ``codea1 plan``, the train-start check.

Measured on small random-init Qwen2 models (no downloads): saved-for-backward bytes of the real update
forward (``torch.autograd.graph.saved_tensors_hooks``) and the kernel's peak RSS of one real ``Policy.step``
in a fresh process (``tests/core/models/memory_probe.py``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from codea1_core.config import Config, apply_overrides  # noqa: E402
from codea1_core.models import memory_plan  # noqa: E402
from codea1_core.models.memory_plan import ModelShape, estimate, saved_activation_bytes, verdict  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
QWEN_YAML = ROOT / "configs" / "qwen2.5-coder-1.5b.yaml"
QWEN_SHAPE = ModelShape.from_hf_config(
    json.loads((ROOT / "configs" / "qwen2.5-coder-1.5b.config.json").read_text())
)
GQA = {
    "vocab_size": 2048,
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "intermediate_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "model_type": "qwen2",
}
MHA = {
    **GQA,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "intermediate_size": 1024,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}


def cpu_cfg(**overrides) -> Config:
    base = {"mode": "golden", "model.device": "cpu", "model.dtype": "float32", "grpo.mini_batches": 1}
    return Config().replace(**{**base, **overrides})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from codea1_core.models.tiny_model import build_tiny_model, random_init_like

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("plan")
    tiny = build_tiny_model(work / "tok", ["def f(x):\n    return x\n"] * 20, vocab_size=300)
    return {
        name: random_init_like(
            {k: v for k, v in raw.items() if k != "model_type"},
            work / name,
            tokenizer_dir=tiny,
            dtype="float32",
        )
        for name, raw in (("gqa", GQA), ("mha", MHA))
    }


@pytest.mark.parametrize("raw", [GQA, MHA], ids=["gqa-tied", "mha-untied"])
def test_parameter_counts_match_the_real_model(raw):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in raw.items() if k != "model_type"}))
    shape = ModelShape.from_hf_config(raw)
    assert shape.param_count() == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "v_proj", "down_proj"]
    lora = get_peft_model(model, LoraConfig(r=8, target_modules=targets, task_type="CAUSAL_LM"))
    assert shape.lora_param_count(8, targets) == sum(p.numel() for p in lora.parameters() if p.requires_grad)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("name", ["gqa", "mha"])
def test_saved_activations_match_the_real_forward(models, name, checkpointing):
    from codea1_core.models.policy import Policy

    cfg = cpu_cfg(**{"model.gradient_checkpointing": checkpointing})
    policy = Policy(str(models[name]), cfg, role="code")
    rng = random.Random(0)
    samples = [
        ([rng.randrange(3, 2048) for _ in range(16)], [rng.randrange(3, 2048) for _ in range(240)])
        for _ in range(8)
    ]
    weights = {p.untyped_storage().data_ptr() for p in policy.model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:  # activations only: parameters are counted as weights
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    policy.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        policy._forward(samples)
    measured = sum(storages.values())
    shape = ModelShape.from_hf_config(GQA if name == "gqa" else MHA)
    predicted = saved_activation_bytes(shape, 8 * 256, 4, checkpointing)
    assert 0.75 < measured / predicted < 1.33, (
        f"measured {measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f}"
    )


@pytest.mark.timeout(900)  # the probe subprocess may take 600 s
def test_step_peak_matches_measured_rss_without_full_vocab_logits(tmp_path):
    """Bug: the update kept full-vocabulary float32 logits (and their log-softmax) for a whole
    micro-batch; on this shape one step then peaked far above the plan.
    """
    probe = ROOT / "tests" / "core" / "models" / "memory_probe.py"
    args = [
        "--vocab",
        "32768",
        "--hidden",
        "128",
        "--layers",
        "2",
        "--intermediate",
        "512",
        "--tokens",
        "4096",
    ]
    out = subprocess.run(
        [sys.executable, str(probe), *args, "--finetune", "full"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT,
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    raw = {**measured["config"], "model_type": "qwen2"}
    plan = estimate(
        cpu_cfg(**{"model.finetune": "full", "grpo.micro_batch_tokens": 4096}),
        ModelShape.from_hf_config(raw),
        0,
        on_gpu=False,
    )
    step_parts = sum(plan.parts[k] for k in ("gradients", "optimizer", "activations", "lm_head"))
    ratio = measured["step_bytes"] / step_parts
    assert 0.7 < ratio < 1.5, f"step peak {measured['step_bytes'] / 2**20:.0f} MiB = {ratio:.2f}x the plan"
    load_ratio = measured["load_bytes"] / (plan.parts["weights"] + plan.parts["reference"])
    assert 0.5 < load_ratio < 1.5, (
        f"loaded {measured['load_bytes'] / 2**20:.0f} MiB = {load_ratio:.2f}x the plan"
    )


def test_block_size_is_the_policys():
    from codea1_core.models.policy import LOGPROB_BLOCK_TOKENS

    assert memory_plan.LOGPROB_BLOCK_TOKENS == LOGPROB_BLOCK_TOKENS


# ------------------------------------------------------------------------------------------ verdicts


def qwen_cfg(*overrides: str) -> Config:
    from codea1_core.config import load_config

    return load_config(QWEN_YAML, list(overrides))


def test_qwen_recipe_verdicts():
    assert verdict(qwen_cfg(), QWEN_SHAPE, 80)[0] and verdict(qwen_cfg(), QWEN_SHAPE, 141)[0]
    full = qwen_cfg("model.finetune=full", "grpo.lr=1.0e-6", "rollout.backend=hf")
    plan = estimate(full, QWEN_SHAPE, 80)
    assert plan.parts["optimizer"] == pytest.approx(
        2 * QWEN_SHAPE.param_count() * 8
    )  # fp32 AdamW, both roles
    assert plan.parts["weights"] == pytest.approx(2 * QWEN_SHAPE.param_count() * 4)  # fp32 master weights
    assert verdict(full, QWEN_SHAPE, 141)[0]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["rollout.gpu_memory_utilization=0.9"], "rollout.gpu_memory_utilization="),
        (
            ["model.gradient_checkpointing=false", "rollout.gpu_memory_utilization=0.2"],
            "model.gradient_checkpointing=true",
        ),
        (["grpo.micro_batch_tokens=262144", "rollout.backend=hf"], "grpo.micro_batch_tokens="),
    ],
)
def test_a_config_that_cannot_fit_names_the_key_to_change(overrides, key):
    cfg = qwen_cfg(*overrides)
    ok, line = verdict(cfg, QWEN_SHAPE, 80)
    assert not ok and "does not fit" in line and f"set {key}" in line
    fixed = line.split("set ", 1)[1]
    assert verdict(apply_overrides(cfg, [fixed]), QWEN_SHAPE, 80)[0], line


@pytest.mark.e2e
def test_codea1_plan_prints_both_gpu_verdicts():
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "plan", "--params", str(QWEN_YAML)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "80 GB GPU: fits" in out.stdout and "141 GB GPU: fits" in out.stdout
    assert "activations" in out.stdout and "vllm" in out.stdout


@pytest.mark.e2e
def test_train_start_stops_in_one_line_when_it_cannot_fit(tmp_path):
    """Only with a GPU (or ``model.gpu_memory_gb``): here 8 GB for two 1.5B policies cannot fit."""
    args = [
        sys.executable,
        "-m",
        "flows.train",
        "--params",
        str(QWEN_YAML),
        "model.gpu_memory_gb=8.0",
        f"orchestration.checkpoint_dir={tmp_path / 'train'}",
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: memory plan: 8 GB GPU: does not fit"), out.stderr
    assert "set " in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "train").exists()


def test_train_start_check_is_off_on_cpu_by_default():
    from flows.plan import check_training_fits

    check_training_fits(qwen_cfg("model.device=cpu"))  # a CPU run is never stopped by the GPU plan
