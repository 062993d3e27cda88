"""The exact fast decode (``rollout.share_prompt: false``) reproduces HF ``generate``: same tokens, log-probs, RNG.

The default shared-prompt decode samples the same distribution with its own random numbers:
``tests/core/models/cpu_decode/test_shared_decode.py``.

Guards against a fast rollout path that silently changes what the lab samples (the default
``make run`` numbers must not move when rollouts get faster). Every comparison is ``torch.equal`` /
``==`` on tokens and float32 log-probs, not a tolerance.
"""

from __future__ import annotations

import pytest
import torch
from support import (  # the decode tests' helpers and fixtures (two intra-op threads, the tiny model)
    DECODE_PROMPTS,
    both_paths,
    random_qwen2,
    two_threads,  # noqa: F401
)
from transformers import AutoModelForCausalLM, LogitsProcessorList

from codea1_core.config import Config
from codea1_core.models.cpu_decode import engine, exact
from codea1_core.models.policy import Policy, SamplingParams, _RawLogprobRecorder
from codea1_core.models.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def lab_dir(tmp_path_factory):
    """The lab's model shape (``params.yaml`` lab section) and tokenizer corpus, random init."""
    from codea1_core.data.warmstart_data import tokenizer_corpus

    lab = Config().lab
    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("fast-lab") / "model",
            tokenizer_corpus(lab),
            hidden_size=lab.hidden_size,
            num_layers=lab.num_layers,
            num_heads=lab.num_heads,
            intermediate_size=lab.intermediate_size,
            vocab_size=lab.vocab_size,
            seed=0,
        )
    )


def make_policy(model_dir: str, **overrides) -> Policy:
    base = {
        "model.device": "cpu",
        "model.dtype": "float32",
        "rollout.batch_size": 2,
        "rollout.share_prompt": False,  # these tests are about the exact mode: bitwise generate
    }
    base.update(overrides)
    torch.manual_seed(0)
    return Policy(model_dir, Config().replace(**base), role="test", total_steps=10)


def assert_same(fast: list, slow: list) -> None:
    assert len(fast) == len(slow)
    for group_fast, group_slow in zip(fast, slow, strict=True):
        assert (
            group_fast == group_slow
        )  # dataclass equality: text, prompt/token ids, log-probs, finish reason


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(max_new_tokens=12, seed=3),
        SamplingParams(max_new_tokens=12, seed=4, temperature=0.7, top_p=0.95),
        SamplingParams(max_new_tokens=9, seed=5, temperature=1.3, top_k=5),
        SamplingParams(max_new_tokens=12, temperature=0.0),
    ],
    ids=["rollout", "eval-top-p", "top-k", "greedy"],
)
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_policy_fast_path_equals_generate(tiny_dir, monkeypatch, sp, finetune):
    pol = make_policy(tiny_dir, **{"model.finetune": finetune})
    fast, slow = both_paths(pol, DECODE_PROMPTS, 3, sp, monkeypatch)
    assert_same(fast, slow)
    assert sum(len(c.token_ids) for g in fast for c in g) > 0


@pytest.mark.parametrize("noise_worker", [True, False])
def test_unpadded_batch_equals_generate(tiny_dir, monkeypatch, noise_worker):
    """One prompt, no padding: HF passes no attention mask to SDPA at all; the fast path must do the same."""
    monkeypatch.setattr(exact, "_spare_core", lambda device: noise_worker)
    pol = make_policy(tiny_dir, **{"model.finetune": "full"})
    fast, slow = both_paths(
        pol, DECODE_PROMPTS[:1], 5, SamplingParams(max_new_tokens=16, seed=7), monkeypatch
    )
    assert_same(fast, slow)


def reference_generate(model, ids, mask, n, eos_ids, max_new_tokens):
    """Today's path by hand: ``generate`` on the n-times repeated batch with the raw log-prob recorder."""
    recorder = _RawLogprobRecorder()
    seqs = model.generate(
        input_ids=ids.repeat_interleave(n, 0),
        attention_mask=mask.repeat_interleave(n, 0),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
        eos_token_id=eos_ids,
        logits_processor=LogitsProcessorList([recorder]),
    )
    new = seqs[:, ids.shape[1] :]
    recorder.take(new[:, -1])
    return new, torch.stack(recorder.logprobs, 1)


@pytest.mark.parametrize("noise_worker", [True, False])
def test_early_stops_padding_and_rng_state_match_generate(tiny_dir, monkeypatch, noise_worker):
    """Rows stop at different steps (many EOS ids), the loop ends when all did, the RNG ends where HF's does.

    With and without the worker thread that draws multinomial's noise ahead (it needs a spare core).
    """
    monkeypatch.setattr(exact, "_spare_core", lambda device: noise_worker)
    started = []
    real_init = exact._NoiseStream.__init__
    monkeypatch.setattr(
        exact._NoiseStream, "__init__", lambda self, *a: started.append(1) or real_init(self, *a)
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    ids = torch.tensor([[0, 0, 5, 9, 11], [3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    eos_ids = list(range(40, 120))  # ~20% of the vocabulary ends a row
    torch.manual_seed(11)
    new, lps = reference_generate(model, ids, mask, 4, eos_ids, 40)
    state_hf = torch.get_rng_state()
    torch.manual_seed(11)
    out = engine.sample(model, ids, mask, n=4, max_new_tokens=40, eos_ids=eos_ids, pad_id=0, do_sample=True)
    assert torch.equal(out.tokens, new) and torch.equal(out.logprobs, lps)
    assert torch.equal(torch.get_rng_state(), state_hf)
    ended = [next(i for i, t in enumerate(row) if t in eos_ids) for row in new.tolist()]
    assert len(set(ended)) > 1 and new.shape[1] < 40  # stops differ per row; all stopped before the limit
    assert bool(started) == noise_worker


def test_lab_shape_equals_generate(lab_dir, monkeypatch):
    """The lab model's shape and a test-rollout-like batch (8 prompts x 4 samples, mixed prompt lengths)."""
    pol = make_policy(lab_dir, **{"model.finetune": "full", "rollout.batch_size": 64})
    prompts = [[{"role": "user", "content": f"Write tests for f{i}. " * (1 + i % 4)}] for i in range(8)]
    fast, slow = both_paths(pol, prompts, 4, SamplingParams(max_new_tokens=24, seed=9), monkeypatch)
    assert_same(fast, slow)


@pytest.mark.slow
def test_lab_training_shape_equals_generate(lab_dir, monkeypatch):
    """The training step's real test-rollout shape: 32 prompts x 4 samples x 128 new tokens."""
    pol = make_policy(lab_dir, **{"model.finetune": "full", "rollout.batch_size": 64})
    prompts = [[{"role": "user", "content": f"Write tests for g{i}(x). " * (2 + i % 5)}] for i in range(32)]
    fast, slow = both_paths(pol, prompts, 4, SamplingParams(max_new_tokens=128, seed=2), monkeypatch)
    assert_same(fast, slow)


def test_models_it_cannot_reproduce_fall_back_to_generate(tiny_dir, tmp_path, monkeypatch):
    """A generation_config that adds a processor (no_repeat_ngram_size) is not reproduced: HF generate runs."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.generation_config.no_repeat_ngram_size = 2
    model.save_pretrained(tmp_path / "m")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "m")
    pol = make_policy(str(tmp_path / "m"), **{"model.finetune": "full"})
    assert "no_repeat_ngram_size" in engine.unsupported_reason(pol.model)
    monkeypatch.setattr(engine, "sample", lambda *a, **k: pytest.fail("fast path used"))
    out = pol.generate(DECODE_PROMPTS[:1], 2, SamplingParams(max_new_tokens=8, seed=1))
    assert [len(c.token_ids) > 0 for c in out[0]] == [True, True]
    assert engine.unsupported_reason(make_policy(tiny_dir).model) is None


def test_models_off_the_cpu_fall_back_to_generate(tiny_dir):
    """The equality is checked on the CPU only; a model elsewhere (here: the meta device) keeps HF generate."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).to("meta")
    assert "device meta" in engine.unsupported_reason(model)


@pytest.mark.parametrize(
    ("name", "lora", "padded"),
    [
        ("lab", False, True),
        ("lab", False, False),
        ("gqa", False, True),
        ("gqa", False, False),
        ("eager", False, True),
        ("eager", False, False),
        ("gqa", True, True),
    ],
)
def test_hand_written_decode_step_equals_hf_forward(name, lora, padded):
    """DecodeStep's logits are bitwise HF's forward with its DynamicCache (what ``generate`` runs), 4 steps.

    Guards the hand-written decode step: any op that differs from modeling_qwen2's in order,
    dtype or shape shows up as a changed float32 logit. Configs: the lab's, GQA, eager attention, LoRA.
    """
    from codea1_core.models.cpu_decode import forward

    model = random_qwen2(name, lora)
    base = engine._base_model(model)
    assert engine.unsupported_reason(model) is None
    vocab = base.config.vocab_size
    ids = torch.randint(2, vocab, (6, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3], mask[4, :1] = 0, 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        ref_cache = out.cache
        cache = exact._ViewCache(ref_cache, ids.shape[1] + 4)
        step = forward.DecodeStep(base, cache, exact._decode_mask(mask, ids.shape[1] + 4))
        position, full_mask = positions[:, -1:], mask
        tokens = out.logits[:, -1].argmax(-1)
        for t in range(4):
            position, full_mask = position + 1, torch.cat([full_mask, torch.ones_like(mask[:, :1])], 1)
            ref = (
                model(
                    input_ids=tokens[:, None],
                    attention_mask=full_mask,
                    position_ids=position,
                    cache=ref_cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
            cache.length = ids.shape[1] + t
            got = step(tokens, position)
            assert torch.equal(got, ref), f"step {t}: max diff {(got - ref).abs().max().item()}"
            tokens = torch.multinomial(torch.softmax(ref, -1), 1, generator=torch.Generator().manual_seed(t))[
                :, 0
            ]


@pytest.mark.parametrize("name", ["gqa", "eager"])
def test_gqa_and_eager_sampling_equal_generate(name, monkeypatch):
    """Padded prompts on a GQA and an eager-attention model: sample() gives generate's tokens and log-probs.

    Guards the eager path's mask: HF's eager attention adds a 0 / dtype-min float mask, not the boolean one.
    """
    monkeypatch.setattr(exact, "_spare_core", lambda device: False)
    model = random_qwen2(name)
    ids = torch.tensor([[0, 0, 5, 9, 11, 4], [3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 9, 9]])
    mask = (ids != 0).long()
    eos_ids = [1, 2]
    torch.manual_seed(5)
    new, lps = reference_generate(model, ids, mask, 3, eos_ids, 12)
    torch.manual_seed(5)
    out = engine.sample(model, ids, mask, n=3, max_new_tokens=12, eos_ids=eos_ids, pad_id=0, do_sample=True)
    assert torch.equal(out.tokens, new) and torch.equal(out.logprobs, lps)
