"""One backend switch: evaluate, solve and attack generate through vLLM when ``rollout.backend: vllm``.

vLLM is GPU-only, so the fake ``vllm`` module of ``tests/core/models/test_vllm_engine.py`` stands in for it; HF
``generate`` is made to fail, so any generation that does not go through the engine fails the test.
"""

from __future__ import annotations

import pytest
import torch
from support import VLLM_CORPUS, FakeExecutor, FakeLLM

from codea1_core.config import Config
from codea1_core.data.lab import lab_problems
from codea1_core.models import vllm_engine
from codea1_core.models.policy import Policy
from codea1_core.models.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return str(build_tiny_model(tmp_path_factory.mktemp("eb") / "m", VLLM_CORPUS, vocab_size=300, seed=0))


def eval_cfg(tmp_path, tiny_dir, backend: str) -> Config:
    return Config().replace(
        **{
            "model.device": "cpu",
            "model.code_path": tiny_dir,
            "model.test_path": tiny_dir,
            "rollout.backend": backend,
            "rollout.max_model_len": 2048,
            "eval.n_samples": 3,
            "eval.k_list": [1, 2],
            "eval.max_new_tokens": 8,
            "eval.solve_candidates": 2,
            "eval.out_dir": str(tmp_path / "eval"),
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "tracking.backend": "null",
        }
    )


@pytest.fixture
def no_hf_generate(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("HF generate used although rollout.backend is vllm")

    monkeypatch.setattr(Policy, "generate", fail)
    monkeypatch.setattr(vllm_engine, "_ROLLOUTS", {})


def requests_sent() -> list:
    return [sp for engine in FakeLLM.instances for _, params, _ in engine.calls for sp in params]


def test_evaluate_solve_and_attack_generate_only_through_vllm(fake_vllm, no_hf_generate, tiny_dir, tmp_path):  # noqa: F811
    from flows.attack import attack
    from flows.evaluate import evaluated_policy
    from flows.solve import solve
    from tasks.evaluate import evaluate_code
    from tasks.evaluate_tests import generate_suites

    cfg = eval_cfg(tmp_path, tiny_dir, "vllm")
    code, test = evaluated_policy(cfg, "code"), evaluated_policy(cfg, "test")
    assert isinstance(code, vllm_engine.VllmPolicy) and isinstance(test, vllm_engine.VllmPolicy)
    problems = lab_problems(cfg.lab, "test")[:2]
    evaluate_code(code, problems, cfg, FakeExecutor(), "lab")
    assert len(requests_sent()) == 2 * cfg.eval.n_samples  # every benchmark sample is one vLLM request
    generate_suites(problems, test, cfg)
    solve(problems[0], code, test, cfg, FakeExecutor())
    attack(problems[0], test, cfg, FakeExecutor())
    sent = requests_sent()
    assert len(sent) > 2 * cfg.eval.n_samples + len(problems)
    assert {(sp.temperature, sp.top_p, sp.max_tokens) for sp in sent} == {
        (cfg.eval.temperature, cfg.eval.top_p, cfg.eval.max_new_tokens)
    }  # the evaluation's sampling settings, not the training rollout's
    served = {lora.lora_name.split("-")[0] for e in FakeLLM.instances for *_, lora in e.calls if lora}
    assert served == {"code", "test"}  # each role's own adapter, synced before its first generation


def test_hf_backend_loads_plain_policies(tiny_dir, tmp_path):
    from flows.evaluate import evaluated_policy

    policy = evaluated_policy(eval_cfg(tmp_path, tiny_dir, "hf"), "code")
    assert type(policy) is Policy
