"""``bench/gpu_step_bench.py`` cannot rot: shrunken on CPU in every run, full size under ``pytest -m gpu``.

The CPU run blocks prefect, mlflow, dvc and Great Expectations from being imported, as on the GPU image, so
the bench keeps depending only on torch, transformers, peft, ``codea1_core`` and ``sandbox``. PyYAML comes
with transformers (huggingface_hub needs it), yet the config and the memory plan must not need it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("prefect", "mlflow", "dvc", "great_expectations")
BLOCKER = """
import sys
for name in {blocked!r}:  # None in sys.modules: `import name` fails, importlib.util.find_spec says absent
    sys.modules[name] = None
"""
RUNNER = (
    BLOCKER.format(blocked=BLOCKED)
    + f"""
sys.argv = ["gpu_step_bench.py", *sys.argv[1:]]
import runpy
runpy.run_path({str(ROOT / "bench" / "gpu_step_bench.py")!r}, run_name="__main__")
"""
)
PHASES = {
    "load_lora",
    "rollout_code",
    "rollout_tests",
    "parse_plan",
    "sandbox",
    "rewards",
    "mistake_book",
    "update_code_lora",
    "update_test_lora",
    "load_full",
    "update_code_full",
}


def run_bench(tmp_path: Path, *args: str, timeout: int) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={"OMP_NUM_THREADS": "1", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def check(result: dict, stdout: str, steps: int) -> None:
    phases = result["phases"]
    assert {r["phase"] for r in phases} == PHASES
    assert sum(r["phase"] == "update_code_lora" for r in phases) == steps
    for r in phases:
        assert r["seconds"] >= 0 and r["peak_gib"] >= 0
        if r["phase"].startswith(("rollout", "update")):
            assert r["tokens"] > 0, r
        if r["phase"].startswith("update"):
            assert r["plan_gib"] > 0 and r["micro_tokens"] > 0, r
    assert all(r["programs"] > 0 for r in phases if r["phase"] == "sandbox")
    assert "tokens/s" in stdout and "memory plan vs measured, update_code_full" in stdout


@pytest.mark.timeout(900)  # the bench subprocess may take 600 s
@pytest.mark.e2e
def test_shrunken_bench_runs_the_core_path_on_cpu(tmp_path):
    args = [
        "--shrink",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--problems",
        "2",
        "--n-code",
        "2",
        "--n-tests",
        "2",
        "--new-tokens",
        "12",
        "--workers",
        "1",
    ]
    result, stdout = run_bench(tmp_path, *args, timeout=600)
    check(result, stdout, steps=2)
    assert result["config"]["num_hidden_layers"] == 2  # shrunken


def test_config_and_memory_plan_need_no_pyyaml():
    code = BLOCKER.format(blocked=("yaml",)) + (
        "from codea1_core.config import Config\n"
        "from codea1_core.models.memory_plan import ModelShape, estimate\n"
        "cfg = Config.from_dict({'model': {'finetune': 'full'}})\n"
        "print(estimate(cfg, ModelShape(64, 2, 4, 2, 128, 1000, True), 80).total > 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]


@pytest.mark.e2e
def test_bench_rejects_bad_arguments_in_one_line():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_step_bench.py"), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--steps: expected >= 1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(2400)  # the bench subprocess may take 1800 s
@pytest.mark.e2e
@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)
def test_full_size_bench_on_gpu(tmp_path):
    result, stdout = run_bench(tmp_path, "--device", "cuda", "--steps", "2", timeout=1800)
    print(stdout)
    check(result, stdout, steps=2)
    assert result["config"]["hidden_size"] == 1536 and result["config"]["vocab_size"] == 151936
