"""Tiny Qwen2 model factory: a normal HF directory with Qwen special tokens and chat template."""

from __future__ import annotations

import pytest
import torch

from codea1_core.models.tiny_model import KNOWN_CONFIGS, build_tiny_model, random_init_like, train_tokenizer

CORPUS = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n", "Add two numbers."] * 30


def test_build_tiny_model_is_a_loadable_qwen2_dir(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    out = build_tiny_model(
        tmp_path / "m",
        CORPUS,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        vocab_size=400,
        seed=1,
    )
    assert not (tmp_path / "m.tmp").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert isinstance(model, Qwen2ForCausalLM) and model.config.hidden_size == 32
    assert model.config.vocab_size == len(tok) <= 400
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1, special
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "add 1 and 2"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nadd 1 and 2<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE round-trips
    code = "def f(x):\n\treturn x ** 2  # é\n"
    assert tok.decode(tok(code)["input_ids"]) == code  # unseen characters fall back to bytes


def test_same_seed_same_weights(tmp_path):
    kw = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 300}
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", CORPUS, seed=3, **kw))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", CORPUS, seed=3, **kw))
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(va, vb), k


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="corpus"):
        train_tokenizer([], 300)
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CORPUS, 100)
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "x", CORPUS, hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="unknown"):
        random_init_like("Qwen/NoSuchModel", tmp_path / "y")


def test_random_init_like_small_override(tmp_path):
    from transformers import AutoModelForCausalLM

    assert KNOWN_CONFIGS["Qwen/Qwen2.5-Coder-1.5B-Instruct"]["num_hidden_layers"] == 28
    cfg = dict(KNOWN_CONFIGS["Qwen/Qwen2.5-Coder-1.5B-Instruct"])
    cfg.update(num_hidden_layers=1, hidden_size=48, intermediate_size=64, vocab_size=512)  # shape logic, fast
    cfg.update(bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model = AutoModelForCausalLM.from_pretrained(random_init_like(cfg, tmp_path / "r"))
    assert model.config.num_key_value_heads == 2 and model.config.num_attention_heads == 12
    assert model.dtype == torch.bfloat16


@pytest.mark.slow
def test_random_init_like_qwen25_coder_1p5b(tmp_path):
    from transformers import AutoConfig

    out = random_init_like("Qwen/Qwen2.5-Coder-1.5B-Instruct", tmp_path / "q")
    config = AutoConfig.from_pretrained(out)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (1536, 28, 151936)
