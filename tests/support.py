"""Shared fakes and builders of the test suite: the one module test modules import helpers from.

No test module imports another test module; what several of them share lives here (fixtures too: a test
module that wants one imports it by name, e.g. ``from support import two_threads  # noqa: F401``; a fixture a
whole folder shares is in its ``conftest.py``: ``fake_vllm`` in ``tests/conftest.py``, the decode tests' ``tiny_dir``
in ``tests/core/models/conftest.py``).

Sections: the tiny training run (a random-init model and a config whose iteration takes a second), the
evaluation fakes (an in-process executor and a fixed-text policy), the fake ``vllm`` module, the decode
comparisons' models and helpers, and the Prefect server helpers of the end-to-end tests. Heavy libraries
(torch, transformers, httpx) are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from codea1_core.config import Config
from codea1_core.types import CallOutcome, Problem, TestCase

if TYPE_CHECKING:
    from codea1_core.models.policy import Policy, SamplingParams


# ------------------------------------------------------------------------------------------------
# The tiny training run
# ------------------------------------------------------------------------------------------------

TINY_LAB = {
    "families": ["is_above", "first_or"],
    "train_per_family": 4,
    "heldout_per_family": 1,
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "warmstart_epochs": 1,
    "warmstart_code_examples_per_problem": 2,
    "warmstart_test_examples_per_problem": 2,
    "warmstart_batch_size": 8,
}
"""A lab whose warm start (base model and both SFTs) takes seconds: the ``lab`` section of the warm-start tests."""


def build_tiny(out_dir: Path) -> Path:
    """A random-init tiny Qwen2 model with the lab tokenizer (no warm start: fast, outputs are noise)."""
    from codea1_core.data.warmstart_data import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model

    corpus = tokenizer_corpus(Config().lab, k=8)[:300]
    return build_tiny_model(
        out_dir, corpus, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=512
    )


def tiny_config(tmp: Path, model: Path, **overrides: object) -> Config:
    """Two problems per step, M = N = 2, 16-token responses: one iteration takes about a second."""
    base = {
        "data.train_batch_size": 2,
        "data.epochs": 1,
        "data.prepared_dir": str(tmp / "no_prepared"),
        "model.code_path": str(model),
        "model.test_path": str(model),
        "model.lora_rank": 4,
        "model.lora_alpha": 8,
        "rollout.n_code": 2,
        "rollout.n_tests": 2,
        "rollout.max_new_tokens_code": 16,
        "rollout.max_new_tokens_test": 16,
        "grpo.mini_batches": 1,
        "grpo.warmup_steps": 1,
        "eval.every": 0,
        "tracking.tracking_uri": f"sqlite:///{tmp}/mlflow.db",
        "tracking.artifact_location": str(tmp / "artifacts"),
        "tracking.log_samples": 4,
        "orchestration.max_steps": 2,
        "orchestration.checkpoint_dir": str(tmp / "train"),
        "lab.train_per_family": 1,
        "lab.heldout_per_family": 1,
    }
    base.update(overrides)
    return Config().replace(**base)


def write_params(cfg: Config, path: Path) -> str:
    """``cfg`` as a params file: every flow takes ``(params, overrides)`` and loads its config itself."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------------------------------------
# Evaluation fakes: problems, an in-process executor, a fixed-text policy
# ------------------------------------------------------------------------------------------------


def problem(pid="t/1", entry="add", tests=(("add(1, 2)", 3),), plus=(("add(5, 5)", 10),), **kw) -> Problem:
    return Problem(
        id=pid,
        source=kw.pop("source", "humanevalplus"),
        split="test",
        prompt=f"def {entry}(a, b):\n    '''Add.'''\n",
        description="Add two numbers.",
        entry_point=entry,
        reference_solution=kw.pop("reference", f"def {entry}(a, b):\n    return a + b\n"),
        tests=tuple(TestCase(c, e) for c, e in tests),
        plus_tests=tuple(TestCase(c, e) for c, e in plus),
        **kw,
    )


class FakeExecutor:
    """In-process stand-in for ``sandbox`` in unit tests of the layers above (no isolation at all)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, list[str]]] = []

    def run(self, program: str, exprs: list[str]) -> list[CallOutcome]:
        ns: dict = {}
        try:
            exec(program, ns)
        except Exception as exc:
            return [CallOutcome("program_error", error=f"{type(exc).__name__}: {exc}") for _ in exprs]
        out = []
        for expr in exprs:
            try:
                out.append(CallOutcome("ok", eval(expr, ns)))
            except Exception as exc:
                out.append(CallOutcome("error", error=f"{type(exc).__name__}: {exc}"))
        return out

    def run_many(self, jobs):
        self.jobs.extend(jobs)
        return [self.run(p, list(e)) for p, e in jobs]


class TextPolicy:
    """Fake policy: ``respond(user_text) -> response text``, same response for all n samples."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.calls = 0

    def generate(self, prompts, n, sampling, on_chunk=None):
        self.calls += 1
        rows = [[SimpleNamespace(text=self.respond(p[-1]["content"])) for _ in range(n)] for p in prompts]
        if on_chunk is not None:
            on_chunk(0, rows)
        return rows


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


# ------------------------------------------------------------------------------------------------
# A fake ``vllm`` module (vLLM is GPU-only)
# ------------------------------------------------------------------------------------------------


VLLM_CORPUS = ["def add(a, b):\n    return a + b\n", "Write add.", "assert add(1, 2) == 3"] * 20


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list = field(default_factory=list)
    skip_special_tokens: bool = True


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeEngineCore:
    """``LLM.llm_engine`` for :meth:`FakeLLM.enqueue`: each ``step`` finishes the two requests queued last (the
    reverse of their order: a streaming consumer must not rely on it)."""

    def __init__(self) -> None:
        self.pending: list = []

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list:
        done, self.pending = self.pending[-2:], self.pending[:-2]
        unfinished = types.SimpleNamespace(finished=False, request_id="-1")
        return [unfinished, *reversed(done)]


class FakeLLM:
    instances: list[FakeLLM] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.rpcs, self.prefix_resets = kwargs, [], [], 0
        self.llm_engine, self.next_id = FakeEngineCore(), 0
        FakeLLM.instances.append(self)

    def enqueue(self, prompts, sampling_params, lora_request=None, use_tqdm=True):
        ids = []
        for out in self.generate(prompts, sampling_params, lora_request, use_tqdm):
            out.finished, out.request_id = True, str(self.next_id)
            ids.append(out.request_id)
            self.next_id += 1
            self.llm_engine.pending.append(out)
        return ids

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append((method, args))
        return [len(args[0]) if args else None]

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def generate(self, prompts, sampling_params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, sampling_params, lora_request))
        outs = []
        for prompt, sp in zip(prompts, sampling_params, strict=True):
            rng = random.Random(sp.seed)
            toks = []
            while len(toks) < sp.max_tokens:
                toks.append(rng.choice([*range(3, 40), *sp.stop_token_ids]))
                if toks[-1] in sp.stop_token_ids:
                    break
            reason = "stop" if toks[-1] in sp.stop_token_ids else "length"
            completion = types.SimpleNamespace(
                text=f"text{len(toks)}",
                token_ids=toks,
                logprobs=[
                    {t: FakeLogprob(-0.1 * (k + 1)), 99: FakeLogprob(-9.0)} for k, t in enumerate(toks)
                ],
                finish_reason=reason,
            )
            outs.append(
                types.SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=[completion])
            )
        return outs


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Put the fake ``vllm`` (and ``vllm.lora.request``) in ``sys.modules`` for one test; the ``fake_vllm``
    fixture of ``tests/conftest.py``."""
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    FakeLLM.instances = []
    return vllm


# ------------------------------------------------------------------------------------------------
# Decode comparisons: the tiny model, two threads, fast path vs HF generate
# ------------------------------------------------------------------------------------------------


DECODE_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "assert add(1, 2) == 3\nassert add(0, 0) == 0\n",
    "Write a Python function that returns the sum of two numbers.",
    "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
] * 20


DECODE_PROMPTS = [
    [{"role": "system", "content": "You write code."}, {"role": "user", "content": "Write add(a, b)."}],
    [{"role": "user", "content": "Write clamp."}],
    [{"role": "user", "content": "Sum two numbers, please, in Python, and explain nothing at all."}],
]


@pytest.fixture(autouse=True)
def two_threads():
    """Two intra-op threads (this repo's 2-core default): HF uses both, the fast decode one (+ the noise worker)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def both_paths(pol: Policy, prompts: list, n: int, sp: SamplingParams, monkeypatch) -> tuple[list, list]:
    """Completions of the fast path and of HF ``generate``, each asserted to have really run."""
    from codea1_core.models.cpu_decode import engine

    calls = {"fast": 0, "hf": 0}
    real_sample, real_generate = engine.sample, pol.model.generate

    def counting_sample(*args, **kwargs):
        calls["fast"] += 1
        return real_sample(*args, **kwargs)

    def counting_generate(*args, **kwargs):
        calls["hf"] += 1
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(engine, "sample", counting_sample)
    monkeypatch.setattr(pol.model, "generate", counting_generate)
    pol.fast_generate = True
    fast = pol.generate(prompts, n, sp)
    assert calls == {"fast": len(range(0, len(prompts), pol.cfg.rollout.batch_size)), "hf": 0}
    pol.fast_generate = False
    slow = pol.generate(prompts, n, sp)
    assert calls["hf"] == calls["fast"]
    return fast, slow


STEP_CONFIGS = {
    "lab": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 1529,
    },
    "gqa": {
        "hidden_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "intermediate_size": 200,
        "vocab_size": 777,
        "rope_theta": 1000000.0,
    },
    "eager": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 400,
        "attn_implementation": "eager",
    },
}


def random_qwen2(name: str, lora: bool = False):
    """A random-init Qwen2ForCausalLM of ``STEP_CONFIGS[name]``; with ``lora``, PEFT LoRA on every projection."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    raw = dict(STEP_CONFIGS[name])
    attn = raw.pop("attn_implementation", "sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**raw, pad_token_id=0, eos_token_id=1, bos_token_id=0))
    model.config._attn_implementation = attn
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        for name_, p in model.named_parameters():
            if "lora_B" in name_:  # non-zero B so the LoRA branch changes the logits
                torch.nn.init.normal_(p, std=0.05)
    return model.eval()


# ------------------------------------------------------------------------------------------------
# Prefect server helpers of the end-to-end tests
# ------------------------------------------------------------------------------------------------


def bare_zygote():
    """A sandbox zygote without namespaces, uid change or cgroups, forked from this process: for the tests that
    look at one of its children (``take`` / ``reap``); the caller closes it."""
    from sandbox import ExecLimits, child, zygote

    ctx = {
        "lim": ExecLimits(call_timeout_s=2.0, program_timeout_s=5.0),
        "uid": None,
        "private_tmp": [],
        "cgroup_fds": [],
        "cgroup_dirs": [],
        "ipc": False,
        "pidns": False,
        "n": 0,
        "peak_fds": [],
    }
    child._deny_layers({"deny": "off"}, {"private_tmp": []}, ctx)
    return zygote.Zygote(ctx, close_fds=())


def fd_targets(pid: int) -> dict[str, str]:
    """``{descriptor: what it points at}`` of ``pid`` (``/proc/<pid>/fd``); one closed while being listed (the
    process runs on) is left out."""
    targets = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            targets[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return targets


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str, why: str, unmounts: int = 1) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted on the new folder ``mnt`` (a full disk, a store to break, a read-only
    filesystem: root ignores file modes, so a mount is the honest way); skips the test, saying ``why`` it needs
    one, where no tmpfs can be mounted (not root). ``unmounts``: lazy unmounts at the end (one more for each
    mount a test stacks on it)."""
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip(f"cannot mount a tmpfs here (not root, or no mount permission): {why}")
    try:
        yield mnt
    finally:
        for _ in range(unmounts):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@contextlib.contextmanager
def log_lines(*loggers: str, fmt: str = "%(levelname)s: %(message)s") -> Iterator[list[str]]:
    """Collect, formatted with ``fmt``, what the named loggers emit while the block runs (the list is filled
    in place, and the handler removed after the block)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logging.Formatter(fmt))
    for name in loggers:
        logging.getLogger(name).addHandler(handler)
    try:
        yield lines
    finally:
        for name in loggers:
            logging.getLogger(name).removeHandler(handler)


def free_port() -> int:
    """A loopback port for a server a test starts (outside the ephemeral range: see ``flows.prefect_server``)."""
    from flows.prefect_server import free_port as pick

    return pick()


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "server exited"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"prefect server at {url} not healthy after {timeout_s}s")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# A DVC repo with the real train stage on a tiny config (the wedge and pipeline-signal tests)
WEDGE_OUTS = [
    {"outputs/train/checkpoints": {"persist": True}},
    {"outputs/train/outcomes": {"persist": True}},
    {"outputs/train/mistake_book.json": {"persist": True}},
    "outputs/train/final",
]


def write_done(
    checkpoint_dir: Path, versions: dict[str, str], run_id: str | None, iteration: int = 1
) -> None:
    """What a finished train stage leaves for evaluate and register: ``final/DONE.json`` naming its config and the
    MLflow run recorded for that config beside the outputs (``tracking.results.record_run_id``)."""
    import json

    from tracking.results import record_run_id

    final = Path(checkpoint_dir) / "final"
    final.mkdir(parents=True, exist_ok=True)
    done = {"iteration": iteration, "versions": versions, "fingerprint": "fp-test"}
    (final / "DONE.json").write_text(json.dumps(done))
    record_run_id(checkpoint_dir, "fp-test", run_id)


def make_repo(repo: Path, model: Path, repo_root: Path) -> dict[str, str]:
    """A DVC repo with the train stage of ``dvc.yaml`` (same outs, metrics, plots) on a tiny config."""
    repo.mkdir()
    import yaml

    cfg = tiny_config(repo, model, **{"orchestration.checkpoint_dir": "outputs/train"})
    (repo / "params.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    stage = {
        "cmd": f"{sys.executable} -m flows.train --params params.yaml",
        "params": ["reward", "orchestration", "rollout"],
        "outs": WEDGE_OUTS,
        "metrics": [{"outputs/train/metrics.json": {"cache": False}}],
        "plots": [
            {"outputs/train/history.csv": {"cache": False, "x": "iteration"}},
            {"outputs/train/plots/training.png": {"cache": False}},
        ],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}, sort_keys=False))
    from prefect.settings import PREFECT_API_URL

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(repo_root),
        PREFECT_API_URL=str(PREFECT_API_URL.value()),
    )
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("MLFLOW_TRACKING_URI", None)
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=repo, env=env, check=True)
    return env


# ------------------------------------------------------------------------------------------------
# Generated-test gate rows: rows with the reason code the parser records for each kept test
# ------------------------------------------------------------------------------------------------


def checked_rows(rows: list[dict], parse_mode: str = "strict", literal_answers: bool = True) -> list[dict]:
    """``rows`` (``problem_id, suite_id, call, answer, entry_point``) with the ``check`` code the parser
    records (``codea1_core.method.validity.suite_checks`` over each (problem, suite) group in row order), as
    ``gates.generated_tests.check_tests`` takes them; a row with a missing call, answer or entry point gets
    ``ok`` (the gate's null expectation reports it)."""
    from codea1_core.method.validity import OK, suite_checks
    from codea1_core.types import ParsedTest

    groups: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        if all(isinstance(row[k], str) for k in ("call", "answer", "entry_point")):
            groups.setdefault((str(row["problem_id"]), str(row["suite_id"])), []).append(i)
    out = [{**row, "check": OK} for row in rows]
    for members in groups.values():
        ep = rows[members[0]]["entry_point"]
        tests = [ParsedTest(rows[i]["call"], rows[i]["answer"]) for i in members]
        codes = suite_checks(tests, ep, any_function=parse_mode == "official", literal=literal_answers)
        for i, code in zip(members, codes, strict=True):
            out[i]["check"] = code
    return out


def gated_problem(pid: str, **kw: object) -> Problem:
    """A problem that passes the problem gate (``gates.problems``); ``kw`` replaces any field."""
    base = dict(
        id=pid,
        source="lab",
        split="train",
        prompt="def f(x):\n",
        description="d",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=(TestCase("f(1)", 1),),
        metadata={"reference_passes": True},
    )
    return Problem(**{**base, **kw})


def gate_row(call: str, answer: str = "1", suite: int = 0, problem: str = "p/1", ep: str = "f") -> dict:
    """One generated test as the test gate's row (``problem_id, suite_id, call, answer, entry_point``)."""
    return {"problem_id": problem, "suite_id": suite, "call": call, "answer": answer, "entry_point": ep}
