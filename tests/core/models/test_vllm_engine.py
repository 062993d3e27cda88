"""vLLM backend contract, checked with a fake ``vllm`` module (the default venv has no vLLM; the tests marked
``vllm`` run a real CPU engine: test_vllm_engine_lora.py, test_vllm_engine_full.py).

The fake records what the engine is asked (engine arguments, sampling parameters, LoRA requests) and
answers in vLLM's ``RequestOutput`` shape, so the conversion to :class:`Completion` is the real code.
"""

from __future__ import annotations

import sys

import pytest
import torch
from support import VLLM_CORPUS, FakeLLM

from codea1_core.config import Config
from codea1_core.models.policy import Completion, Policy, SamplingParams
from codea1_core.models.tiny_model import build_tiny_model

PROMPTS = [[{"role": "user", "content": "Write add."}], [{"role": "user", "content": "Write sub."}]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return str(build_tiny_model(tmp_path_factory.mktemp("v") / "m", VLLM_CORPUS, vocab_size=300, seed=0))


def cfg(**overrides) -> Config:
    return Config().replace(**{"model.device": "cpu", "rollout.max_model_len": 2048, **overrides})


def test_shared_engine_serves_both_roles_with_versioned_adapters(fake_vllm, tiny_dir, tmp_path):
    from codea1_core.models.vllm_engine import VllmRollout

    rollout = VllmRollout(cfg(), {"code": tiny_dir, "test": tiny_dir}, tmp_path / "adapters")
    assert len(FakeLLM.instances) == 1
    kw = FakeLLM.instances[0].kwargs
    assert kw["gpu_memory_utilization"] == 0.8 and kw["max_model_len"] == 1024  # 2048 > the model's 1024
    assert kw["enable_prefix_caching"] is True and kw["enable_lora"] is True and kw["max_lora_rank"] == 16
    assert kw["logprobs_mode"] == "raw_logprobs"
    if not torch.cuda.is_available():  # vLLM's CPU build: whole-prompt prefill, the CPU policy's float32
        assert kw["enable_chunked_prefill"] is False and kw["dtype"] == "float32"

    code = Policy(tiny_dir, cfg(), role="code")
    test = Policy(tiny_dir, cfg(), role="test")
    # no request without an adapter on a LoRA engine: generate refuses a role that has none yet
    with pytest.raises(RuntimeError, match="no adapter synced yet"):
        rollout.generate("code", PROMPTS, 1, SamplingParams(max_new_tokens=6, seed=10))
    assert FakeLLM.instances[0].calls == []
    path1 = rollout.sync(code)  # the zero-initialised adapter (= the base model)
    outs = rollout.generate("code", PROMPTS, 3, SamplingParams(max_new_tokens=6, seed=10))
    assert [len(g) for g in outs] == [3, 3]
    prompts, params, lora = FakeLLM.instances[0].calls[-1]
    assert lora.lora_name == "code-v1" and lora.lora_path == str(path1)
    assert [p.seed for p in params] == list(range(10, 16)) and all(p.logprobs == 0 for p in params)
    assert all(p.n == 1 and p.top_k == -1 and p.repetition_penalty == 1.0 for p in params)
    tok = rollout.tokenizers["code"]
    assert tok.convert_tokens_to_ids("<|im_end|>") in params[0].stop_token_ids
    for group, prompt in zip(outs, PROMPTS, strict=True):
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        for c in group:
            assert isinstance(c, Completion)
            assert c.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]
            assert c.logprobs == pytest.approx([-0.1 * (k + 1) for k in range(len(c.token_ids))])
            assert c.finish_reason == ("stop" if c.token_ids[-1] in params[0].stop_token_ids else "length")

    assert (path1 / "adapter_config.json").is_file() and (path1 / "adapter_model.safetensors").is_file()
    rollout.sync(test)
    path2 = rollout.sync(code)
    rollout.generate("code", PROMPTS[:1], 1, SamplingParams(max_new_tokens=2))
    code_req = FakeLLM.instances[0].calls[-1][2]
    rollout.generate("test", PROMPTS[:1], 1, SamplingParams(max_new_tokens=2))
    test_req = FakeLLM.instances[0].calls[-1][2]
    assert code_req.lora_path == str(path2) and code_req.lora_name == "code-v2"
    assert test_req.lora_name == "test-v1" and code_req.lora_int_id != test_req.lora_int_id
    assert len({code_req.lora_int_id, test_req.lora_int_id, 1}) == 3  # a new id per version


def test_one_engine_per_role_when_not_shared(fake_vllm, tiny_dir, tmp_path):
    from codea1_core.models.vllm_engine import VllmRollout

    other = str(build_tiny_model(tmp_path / "other", VLLM_CORPUS, vocab_size=300, seed=1))
    rollout = VllmRollout(
        cfg(**{"rollout.shared_engine": False}), {"code": tiny_dir, "test": other}, tmp_path / "a"
    )
    assert len(FakeLLM.instances) == 2
    assert [e.kwargs["gpu_memory_utilization"] for e in FakeLLM.instances] == [0.4, 0.4]
    assert [e.kwargs["model"] for e in FakeLLM.instances] == [tiny_dir, other]
    assert rollout.engines["code"] is not rollout.engines["test"]
    with pytest.raises(ValueError, match="shared_engine=true needs both roles on one base"):
        VllmRollout(cfg(), {"code": tiny_dir, "test": other}, tmp_path / "b")


def test_tensor_and_data_parallel_sizes_reach_the_engine(fake_vllm, tiny_dir, tmp_path):
    """``rollout.tensor_parallel_size``/``data_parallel_size`` are passed to every engine (data parallel only
    when > 1, so single-GPU engine arguments stay as before); sizes below 1 fail with the key's name."""
    from codea1_core.models.vllm_engine import VllmRollout

    VllmRollout(cfg(**{"rollout.max_model_len": 512}), {"code": tiny_dir}, tmp_path / "a")
    assert FakeLLM.instances[-1].kwargs["max_model_len"] == 512  # within the model's context length
    assert FakeLLM.instances[-1].kwargs["tensor_parallel_size"] == 1
    assert "data_parallel_size" not in FakeLLM.instances[-1].kwargs
    other = str(build_tiny_model(tmp_path / "other", VLLM_CORPUS, vocab_size=300, seed=1))
    parallel = cfg(
        **{"rollout.tensor_parallel_size": 2, "rollout.data_parallel_size": 4, "rollout.shared_engine": False}
    )
    VllmRollout(parallel, {"code": tiny_dir, "test": other}, tmp_path / "b")
    for engine in FakeLLM.instances[-2:]:
        assert (engine.kwargs["tensor_parallel_size"], engine.kwargs["data_parallel_size"]) == (2, 4)
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size"):
        VllmRollout(cfg(**{"rollout.tensor_parallel_size": 0}), {"code": tiny_dir}, tmp_path / "c")


def test_attach_routes_generate_through_vllm_and_syncs_after_step(fake_vllm, tiny_dir, tmp_path):
    from codea1_core.models.policy import TrainBatch
    from codea1_core.models.vllm_engine import attach

    c = cfg(**{"orchestration.checkpoint_dir": str(tmp_path / "train")})
    code = attach(Policy(tiny_dir, c, role="code"), c)
    test = attach(Policy(tiny_dir, c, role="test"), c)
    assert len(FakeLLM.instances) == 1  # both roles on one shared engine
    engine = FakeLLM.instances[0]
    outs = code.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4))
    assert engine.calls[-1][2].lora_name == "code-v1"
    assert (tmp_path / "train" / "vllm_adapters" / "code" / "v00001" / "adapter_model.safetensors").is_file()
    code.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2))
    assert engine.calls[-1][2].lora_name == "code-v1"  # no step in between: no new version
    flat = [x for g in outs for x in g]
    metrics = code.step(
        TrainBatch([x.prompt_ids for x in flat], [x.token_ids for x in flat], [1.0, -1.0] * 2)
    )
    assert metrics["tokens"] > 0 and code.step_count == 1 and code.role == "code"
    assert metrics["time/sync_code_s"] >= 0.0  # synced right after the step, timed
    assert (tmp_path / "train" / "vllm_adapters" / "code" / "v00002" / "adapter_model.safetensors").is_file()
    code.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2))
    assert engine.calls[-1][2].lora_name == "code-v2"
    test.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2))
    assert engine.calls[-1][2].lora_name == "test-v1"


def test_same_seed_same_samples_and_clear_errors(fake_vllm, tiny_dir, tmp_path):
    from codea1_core.models.vllm_engine import VllmRollout

    rollout = VllmRollout(cfg(), {"code": tiny_dir}, tmp_path / "a")
    rollout.sync(Policy(tiny_dir, cfg(), role="code"))
    sp = SamplingParams(max_new_tokens=5, seed=4)
    first = [[c.token_ids for c in g] for g in rollout.generate("code", PROMPTS, 2, sp)]
    assert first == [[c.token_ids for c in g] for g in rollout.generate("code", PROMPTS, 2, sp)]
    with pytest.raises(ValueError, match="role 'test'"):
        rollout.generate("test", PROMPTS, 1, sp)
    with pytest.raises(ValueError, match="code rollout: prompt 0 has .* tokens > limit 1"):
        rollout.generate("code", PROMPTS, 1, SamplingParams(max_new_tokens=5, max_prompt_tokens=1))


def test_streamed_prompts_are_the_generated_ones_each_once_as_it_finishes(fake_vllm, tiny_dir, tmp_path):
    """``on_chunk`` (the train step's overlap): each prompt's n completions as soon as the last of them finishes,
    in finishing order, and the same completions as one ``generate`` call."""
    from codea1_core.models.vllm_engine import VllmRollout

    rollout = VllmRollout(cfg(), {"code": tiny_dir}, tmp_path / "a")
    rollout.sync(Policy(tiny_dir, cfg(), role="code"))
    prompts, sp = PROMPTS * 2, SamplingParams(max_new_tokens=5, seed=4)
    whole = rollout.generate("code", prompts, 3, sp)
    seen: list = []
    streamed = rollout.generate("code", prompts, 3, sp, on_chunk=lambda i, rows: seen.append((i, rows)))
    ids = [[c.token_ids for c in g] for g in whole]
    assert [[c.token_ids for c in g] for g in streamed] == ids
    assert [i for i, _ in seen] == [3, 2, 1, 0]  # the fake engine finishes the last requests first
    assert all(len(rows) == 1 and [c.token_ids for c in rows[0]] == ids[i] for i, rows in seen)


def test_full_finetuning_pushes_weights_into_one_engine_per_role(fake_vllm, tiny_dir, tmp_path):
    """``model.finetune=full``: no LoRA, one engine per role (their weights differ), the weight-sync worker
    extension installed, and ``sync`` pushes every tensor of the policy in place and drops the prefix cache."""
    from codea1_core.models.vllm_engine import VllmRollout
    from codea1_core.models.vllm_weights import WORKER_EXTENSION

    full = cfg(**{"model.finetune": "full"})
    rollout = VllmRollout(full, {"code": tiny_dir, "test": tiny_dir}, tmp_path / "a")
    assert len(FakeLLM.instances) == 2 and rollout.engines["code"] is not rollout.engines["test"]
    for engine in FakeLLM.instances:
        assert (
            engine.kwargs["worker_extension_cls"] == WORKER_EXTENSION and "enable_lora" not in engine.kwargs
        )
        assert engine.kwargs["gpu_memory_utilization"] == 0.4
    code = Policy(tiny_dir, full, role="code")
    rollout.generate("code", PROMPTS, 1, SamplingParams(max_new_tokens=3))  # the base weights: no adapter
    assert FakeLLM.instances[0].calls[-1][2] is None
    assert rollout.sync(code) is None
    ((method, (packed,)),) = FakeLLM.instances[0].rpcs
    assert method == "codea1_load_weights" and FakeLLM.instances[0].prefix_resets == 1
    assert [name for name, *_ in packed] == list(code.whole.state_dict())
    assert FakeLLM.instances[1].rpcs == []  # the test role's engine is untouched


def test_vllm_is_imported_lazily():
    """Importing the backend module must not need vllm (the CPU install has none)."""
    import subprocess

    code = (
        "import sys, codea1_core.models.vllm_engine, codea1_core.models.policy; print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
