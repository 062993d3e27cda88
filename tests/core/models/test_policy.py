"""Policy: batched generation contract, the GRPO step (LoRA and full), two-role isolation, checkpoints.

All on a tiny random-init Qwen2 model built locally (no downloads), CPU, float32.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from codea1_core.config import Config  # noqa: E402
from codea1_core.models.policy import Completion, Policy, SamplingParams, TrainBatch, lr_factor  # noqa: E402
from codea1_core.models.tiny_model import build_tiny_model  # noqa: E402

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "assert add(1, 2) == 3\nassert add(0, 0) == 0\n",
    "Write a Python function that returns the sum of two numbers.",
    "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
] * 20

PROMPTS = [
    [{"role": "system", "content": "You write code."}, {"role": "user", "content": "Write add(a, b)."}],
    [{"role": "user", "content": "Write clamp."}],
    [{"role": "user", "content": "Sum two numbers, please, in Python."}],
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", CORPUS, vocab_size=400, seed=0))


def make_cfg(**overrides) -> Config:
    base = {"model.device": "cpu", "rollout.batch_size": 2, "grpo.lr": 1.0e-3, "grpo.warmup_steps": 1}
    base.update(overrides)
    return Config().replace(**base)


def make_policy(tiny_dir, role="code", seed=0, **overrides) -> Policy:
    torch.manual_seed(seed)  # LoRA A matrices are randomly initialised
    return Policy(tiny_dir, make_cfg(**overrides), role=role, total_steps=50)


def rollout_batch(pol: Policy, n: int = 4, max_new_tokens: int = 6, seed: int = 0) -> TrainBatch:
    outs = pol.generate(PROMPTS, n, SamplingParams(max_new_tokens=max_new_tokens, seed=seed))
    flat = [c for group in outs for c in group]
    advantages = [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(len(flat))]
    return TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], advantages)


def params(module: torch.nn.Module, *, trainable: bool) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad == trainable}


# ------------------------------------------------------------------------------------------ generation


def test_generate_contract(tiny_dir):
    pol = make_policy(tiny_dir)
    sp = SamplingParams(max_new_tokens=8, seed=3)
    outs = pol.generate(PROMPTS, 3, sp)
    assert [len(g) for g in outs] == [3, 3, 3]
    for prompt, group in zip(PROMPTS, outs, strict=True):
        expected_prompt = pol.tokenizer(pol.render(prompt), add_special_tokens=False)["input_ids"]
        for c in group:
            assert isinstance(c, Completion)
            assert c.prompt_ids == expected_prompt  # left padding stripped
            assert len(c.logprobs) == len(c.token_ids) <= 8
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in pol.eos_ids
                assert not any(t in pol.eos_ids for t in c.token_ids[:-1])
            else:
                assert len(c.token_ids) == 8
    # The chat template is the real code path: the prompt ends with the assistant header.
    assert pol.render(PROMPTS[0]).endswith("<|im_start|>assistant\n")
    # Seeded: the same call gives the same samples.
    again = pol.generate(PROMPTS, 3, sp)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in outs]


def test_prompt_limit_is_an_error_not_a_truncation(tiny_dir):
    """§3 step 5: an over-long (Test-LLM) prompt raises a clear error; prompt_lengths counts what generate encodes."""
    from codea1_core.models.policy import PromptTooLongError, prompt_lengths

    pol = make_policy(tiny_dir)
    lengths = prompt_lengths(pol.tokenizer, PROMPTS, use_chat_template=True)
    outs = pol.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, max_prompt_tokens=max(lengths)))
    assert [len(g[0].prompt_ids) for g in outs] == lengths  # at the limit: fine, nothing cut
    with pytest.raises(
        PromptTooLongError, match=rf"code rollout: prompt \d has {max(lengths)} tokens > limit"
    ):
        pol.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, max_prompt_tokens=max(lengths) - 1))
    assert pol.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, max_prompt_tokens=0))  # 0: no limit


def test_generate_logprobs_are_raw_policy_logprobs(tiny_dir):
    """Sampling log-probs (temperature 0.7, top-k) equal the temperature-1 log-probs the step recomputes."""
    pol = make_policy(tiny_dir)
    outs = pol.generate(PROMPTS[:2], 2, SamplingParams(temperature=0.7, top_k=50, max_new_tokens=6, seed=1))
    flat = [c for g in outs for c in g]
    lp, _, _ = pol._forward([(c.prompt_ids, c.token_ids) for c in flat])
    for row, c in enumerate(flat):
        torch.testing.assert_close(lp[row, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_greedy_is_deterministic_across_batch_sizes(tiny_dir):
    pol = make_policy(tiny_dir, **{"rollout.batch_size": 1})
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    one_by_one = [g[0].token_ids for g in pol.generate(PROMPTS, 1, greedy)]
    pol_batched = make_policy(tiny_dir, **{"rollout.batch_size": 8})
    batched = [g[0].token_ids for g in pol_batched.generate(PROMPTS, 1, greedy)]
    assert batched == one_by_one


def test_plain_prompt_without_chat_template(tiny_dir):
    pol = make_policy(tiny_dir, **{"model.use_chat_template": False})
    text = pol.render(PROMPTS[1])
    assert "<|im_start|>" not in text and text.rstrip().endswith("Assistant:")
    assert len(pol.generate(PROMPTS[1:2], 2, SamplingParams(max_new_tokens=3))[0]) == 2


def test_bad_prompt_message_is_a_clear_error(tiny_dir):
    pol = make_policy(tiny_dir)
    with pytest.raises(ValueError, match="prompt message 0"):
        pol.generate([[{"role": "user"}]], 1, SamplingParams(max_new_tokens=2))


# ------------------------------------------------------------------------------------------ the step


def test_lora_step_moves_adapter_only(tiny_dir):
    pol = make_policy(tiny_dir)
    batch = rollout_batch(pol)
    base_before, lora_before = params(pol.model, trainable=False), params(pol.model, trainable=True)
    assert lora_before and all("lora_" in k for k in lora_before)
    metrics = pol.step(batch)
    for key in (
        "loss",
        "pg_loss",
        "kl",
        "clip_frac",
        "grad_norm",
        "entropy",
        "tokens",
        "lr",
        "zero_adv_frac",
    ):
        assert key in metrics, key
    assert metrics["tokens"] == sum(len(c) for c in batch.completion_ids)
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0
    assert pol.step_count == 1
    lora_after = params(pol.model, trainable=True)
    moved = [k for k in lora_before if not torch.equal(lora_before[k], lora_after[k])]
    assert len(moved) == len(lora_before), (
        "every LoRA parameter should move (B starts at 0, A gets grad after)"
    )
    for k, v in params(pol.model, trainable=False).items():
        assert torch.equal(v, base_before[k]), f"frozen base parameter {k} changed"


def test_full_finetune_moves_weights_and_keeps_reference(tiny_dir):
    pol = make_policy(tiny_dir, **{"model.finetune": "full", "grpo.lr": 1.0e-3})
    ref_before = {k: v.clone() for k, v in pol.ref_model.state_dict().items()}
    before = params(pol.model, trainable=True)
    batch = rollout_batch(pol)
    pol.step(batch)
    m2 = pol.step(batch)
    after = params(pol.model, trainable=True)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for k, v in pol.ref_model.state_dict().items():
        assert torch.equal(v, ref_before[k])
    assert m2["kl"] > 0  # the policy has left the frozen reference


def test_two_policies_do_not_touch_each_other(tiny_dir):
    code, test = make_policy(tiny_dir, "code", seed=0), make_policy(tiny_dir, "test", seed=1)
    batch = rollout_batch(code)
    test_before, code_before = params(test.model, trainable=True), params(code.model, trainable=True)
    code.step(batch)
    for k, v in params(test.model, trainable=True).items():
        assert torch.equal(v, test_before[k]), f"test policy {k} changed by the code step"
    code_mid = params(code.model, trainable=True)
    assert any(not torch.equal(code_mid[k], code_before[k]) for k in code_mid)
    test.step(batch)
    for k, v in params(code.model, trainable=True).items():
        assert torch.equal(v, code_mid[k]), f"code policy {k} changed by the test step"
    assert code.optimizer is not test.optimizer and code.step_count == test.step_count == 1


def test_micro_batching_is_an_exact_token_mean(tiny_dir):
    """Splitting a mini-batch into one-sample micro-batches gives the same update as one big micro-batch."""
    big = make_policy(tiny_dir, **{"grpo.mini_batches": 1, "grpo.micro_batch_tokens": 100000})
    small = make_policy(tiny_dir, **{"grpo.mini_batches": 1, "grpo.micro_batch_tokens": 1})
    batch = rollout_batch(big)
    assert len(small._micro_batches(list(range(len(batch.advantages))), batch)) == len(batch.advantages)
    grads = {}

    def capture(name, pol):
        step = pol.optimizer.step

        def wrapped(*args, **kwargs):
            grads[name] = {k: p.grad.clone() for k, p in pol.model.named_parameters() if p.requires_grad}
            return step(*args, **kwargs)

        pol.optimizer.step = wrapped

    capture("big", big)
    capture("small", small)
    m_big, m_small = big.step(batch), small.step(batch)
    assert m_big["loss"] == pytest.approx(m_small["loss"], abs=1e-6)
    assert m_big["grad_norm"] == pytest.approx(m_small["grad_norm"], rel=1e-4)
    assert m_big["grad_norm"] > 0
    for k, g in grads["big"].items():
        torch.testing.assert_close(grads["small"][k], g, atol=1e-7, rtol=1e-4)


def test_given_old_logprobs_match_recomputed(tiny_dir):
    pol_a, pol_b = make_policy(tiny_dir), make_policy(tiny_dir)
    outs = pol_a.generate(PROMPTS, 2, SamplingParams(max_new_tokens=5, seed=2))
    flat = [c for g in outs for c in g]
    adv = [1.0, -1.0] * 3
    with_old = TrainBatch(
        [c.prompt_ids for c in flat], [c.token_ids for c in flat], adv, [c.logprobs for c in flat]
    )
    m_a = pol_a.step(with_old)
    m_b = pol_b.step(TrainBatch(with_old.prompt_ids, with_old.completion_ids, adv))
    assert m_a["loss"] == pytest.approx(m_b["loss"], abs=1e-4)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_update_forward_gives_the_old_logprobs_bit_for_bit(tiny_dir, monkeypatch, finetune):
    """One mini-batch, no dropout: the old log-probs come from the update's own forward (no pass of their own),
    and the step's weights and metrics are bitwise those of a step that runs the separate old pass."""
    cfg = {"grpo.mini_batches": 1, "model.finetune": finetune}
    reused, separate = make_policy(tiny_dir, **cfg), make_policy(tiny_dir, **cfg)
    batch = rollout_batch(reused)
    assert reused.update_gives_old_logprobs(1)
    monkeypatch.setattr(separate, "update_gives_old_logprobs", lambda mini_batches: False)
    passes: list[bool] = []
    for pol in (reused, separate):
        run = pol._logprobs_no_grad
        monkeypatch.setattr(
            pol,
            "_logprobs_no_grad",
            lambda b, i, reference, run=run: passes.append(reference) or run(b, i, reference),
        )
    for _ in range(2):  # the second step: weights moved by the first, old != reference log-probs
        passes.clear()
        m_reused = reused.step(batch)
        assert passes == [True]  # the reference pass only
        m_separate = separate.step(batch)
        assert passes == [True, False, True]
        m_reused.pop("seconds"), m_separate.pop("seconds")
        assert m_reused == m_separate
        assert m_reused["grad_norm"] > 0
        for k, v in params(separate.model, trainable=True).items():
            assert torch.equal(params(reused.model, trainable=True)[k], v), k


def test_dropout_or_several_mini_batches_keep_the_old_logprob_pass(tiny_dir):
    """Training mode changes the numbers under dropout; a second mini-batch sees updated weights."""
    assert not make_policy(tiny_dir, **{"grpo.mini_batches": 2}).update_gives_old_logprobs(2)
    dropout = make_policy(tiny_dir, **{"grpo.mini_batches": 1, "model.lora_dropout": 0.1})
    assert not dropout.update_gives_old_logprobs(1)
    passes: list[bool] = []
    run = dropout._logprobs_no_grad
    dropout._logprobs_no_grad = lambda b, i, reference: passes.append(reference) or run(b, i, reference)
    dropout.step(rollout_batch(dropout))
    assert passes == [False, True]
    attention = make_policy(tiny_dir, **{"grpo.mini_batches": 1, "model.finetune": "full"})
    attention.model.config.attention_dropout = 0.1  # applied functionally in training mode, no module
    assert not attention.update_gives_old_logprobs(1)
    gpu = make_policy(tiny_dir, **{"grpo.mini_batches": 1})
    gpu.device = torch.device(
        "cuda"
    )  # not moved: only the decision is asked (a GPU kernel may differ with grad)
    assert not gpu.update_gives_old_logprobs(1)


def test_skip_zero_variance_groups(tiny_dir):
    pol = make_policy(tiny_dir, **{"grpo.skip_zero_variance_groups": True})
    batch = rollout_batch(pol)
    batch.advantages = [0.0] * len(batch.advantages)
    before = params(pol.model, trainable=True)
    metrics = pol.step(batch)
    assert metrics["zero_adv_frac"] == 1.0 and metrics["tokens"] == 0.0
    for k, v in params(pol.model, trainable=True).items():
        assert torch.equal(v, before[k])
    off = make_policy(tiny_dir)
    assert off.step(batch)["tokens"] > 0  # default: zero-advantage samples still count (D9)


def test_bad_batch_is_a_clear_error(tiny_dir):
    pol = make_policy(tiny_dir)
    with pytest.raises(ValueError, match="2 prompts, 2 completions, 1 advantages"):
        pol.step(TrainBatch([[1], [2]], [[3], [4]], [1.0]))
    with pytest.raises(ValueError, match="sample 1: old_logprobs length"):
        pol.step(TrainBatch([[1], [2]], [[3], [4]], [1.0, 0.0], [[-1.0], [-1.0, -2.0]]))


def test_lr_schedule_warmup_then_cosine_to_zero():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100) == pytest.approx(0.5)
    assert lr_factor(100, 10, 100) == pytest.approx(0.0, abs=1e-12)


def test_toy_reward_rises_and_base_stays_frozen(tiny_dir):
    """Learning sanity: reward = share of completion tokens in a target set (ids divisible by 8).

    The random-init model's final norm and tied head are frozen, so adapters on attention alone can barely
    move its near-uniform output distribution; an adapter on ``lm_head`` (still LoRA, base frozen) can.
    """
    overrides = {
        "grpo.lr": 2.0e-2,
        "grpo.mini_batches": 1,
        "model.lora_target_modules": ["q_proj", "lm_head"],
    }
    pol = make_policy(tiny_dir, **overrides)
    base_before = params(pol.model, trainable=False)

    def reward(c: Completion) -> float:
        return sum(t % 8 == 0 for t in c.token_ids) / max(1, len(c.token_ids))

    history = []
    for it in range(20):
        outs = pol.generate(PROMPTS[:2], 8, SamplingParams(max_new_tokens=6, seed=it))
        flat, adv = [], []
        for group in outs:
            r = torch.tensor([reward(c) for c in group])
            adv += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
            flat += group
        history.append(float(torch.tensor([reward(c) for c in flat]).mean()))
        pol.step(TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], adv))
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert last > first + 0.4, f"reward did not rise: {history}"
    for k, v in params(pol.model, trainable=False).items():
        assert torch.equal(v, base_before[k])


# ------------------------------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_save_load_then_next_step_matches(tiny_dir, tmp_path, finetune):
    pol = make_policy(tiny_dir, seed=0, **{"model.finetune": finetune})
    batch1, batch2 = rollout_batch(pol, seed=1), rollout_batch(pol, seed=2)
    pol.step(batch1)
    pol.save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt.tmp").exists()
    expected = pol.step(batch2)
    resumed = make_policy(tiny_dir, seed=123, **{"model.finetune": finetune})  # different LoRA init
    resumed.load(tmp_path / "ckpt")
    assert resumed.step_count == 1
    got = resumed.step(batch2)
    assert got["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert got["lr"] == pytest.approx(expected["lr"])
    p_exp, p_got = params(pol.model, trainable=True), params(resumed.model, trainable=True)
    for k in p_exp:
        torch.testing.assert_close(p_got[k], p_exp[k], atol=1e-6, rtol=0)


def test_load_rejects_a_non_checkpoint(tiny_dir, tmp_path):
    pol = make_policy(tiny_dir)
    with pytest.raises(FileNotFoundError, match="state.pt missing"):
        pol.load(tmp_path)


def test_export_is_a_standalone_merged_model(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pol = make_policy(tiny_dir)
    pol.step(rollout_batch(pol))
    out = pol.export(tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in model.state_dict())
    assert AutoTokenizer.from_pretrained(out).chat_template
    ids = torch.tensor([pol.tokenizer(pol.render(PROMPTS[0]), add_special_tokens=False)["input_ids"]])
    pol.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, pol.model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    assert any("lora_" in k for k, _ in pol.model.named_parameters())  # the live policy keeps its adapter


def test_gradient_checkpointing_gives_the_same_step(tiny_dir):
    plain = make_policy(tiny_dir, **{"grpo.mini_batches": 1})
    ckpt = make_policy(tiny_dir, **{"grpo.mini_batches": 1, "model.gradient_checkpointing": True})
    batch = rollout_batch(plain)
    m_plain, m_ckpt = plain.step(batch), ckpt.step(batch)
    assert m_ckpt["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_ckpt["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)


def test_a_lora_checkpoint_is_the_same_bytes_whatever_the_string_hashing(tiny_dir, tmp_path):
    """peft writes ``target_modules`` from a set: its order followed each process's string hashing, so the same
    adapter saved in two runs differed (and so did the checkpoints' hash in ``dvc.lock``)."""
    import subprocess
    import sys

    code = (
        "import sys, torch; sys.path[:0] = ['tests', '.']; torch.manual_seed(0)\n"
        "from codea1_core.config import Config\n"
        "from codea1_core.models.loading import build_policy\n"
        "cfg = Config().replace(**{'model.device': 'cpu', 'model.finetune': 'lora'})\n"
        "build_policy(sys.argv[1], cfg, 'code', 10).save(__import__('pathlib').Path(sys.argv[2]))\n"
    )
    configs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / seed
        env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", code, tiny_dir, str(out)], check=True, env=env, timeout=300)
        configs.append((out / "model" / "adapter_config.json").read_text())
    assert configs[0] == configs[1] == configs[2]
    assert '"target_modules": [\n    "down_proj",' in configs[0]
