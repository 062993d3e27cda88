"""The reproducible numerics mode (``model.cpu_numerics``): which CPU kernels round the numbers, pinned and checked.

Guards the bug where a fresh clone's ``make run`` on another x86-64 machine (another vendor, AVX-512) gave other
numbers from the warm start on, and ``tests/core/models/cpu_decode/test_shared_decode.py``'s bitwise split
test failed there: MKL and
ATen picked that CPU's kernels, which round otherwise. The short-run test forces the kernel levels other CPUs
would pick and asserts the same numbers; it also shows that the levels do change the numbers outside the mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codea1_core.config import Config, ConfigError, load_config
from codea1_core.models import cpu_numerics
from flows import environment
from flows.environment import NUMERICS_ENV, NUMERICS_SET_VAR, REPRODUCIBLE_NUMERICS, apply, pin_numerics

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SESSION = os.environ.get(NUMERICS_ENV, "").lower() == "native"


@pytest.mark.skipif(NATIVE_SESSION, reason=f"{NUMERICS_ENV}=native: this session runs the CPU's own kernels")
def test_the_default_is_the_reproducible_mode_and_torch_runs_it(repo_root):
    """conftest imports ``flows`` first: MKL and ATen run the pinned levels; the config's default and the shipped
    ``params.yaml`` (the committed baseline's mode) agree."""
    assert Config().model.cpu_numerics == "reproducible"
    assert load_config(repo_root / "params.yaml").model.cpu_numerics == "reproducible"
    assert cpu_numerics.mkl_cbwr_branch() == "COMPATIBLE"
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    record = cpu_numerics.describe("reproducible")
    assert record["mkl_cbwr"] == "COMPATIBLE" and record["torch"] == torch.__version__ and record["cpu"]


@pytest.fixture
def clean_env(monkeypatch):
    """No numerics variables set (restored afterwards); torch's own levels read as the pinned ones."""
    for key in (*REPRODUCIBLE_NUMERICS, NUMERICS_SET_VAR, NUMERICS_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(cpu_numerics, "mkl_cbwr_branch", lambda: "COMPATIBLE")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    return monkeypatch


def test_defaults_keep_the_users_own_settings_and_native_takes_back_only_the_defaults(clean_env):
    clean_env.setenv("ATEN_CPU_CAPABILITY", "AVX2")  # the user's own, the pinned level in other letters
    apply()
    assert {k: os.environ[k] for k in REPRODUCIBLE_NUMERICS} == REPRODUCIBLE_NUMERICS | {
        "ATEN_CPU_CAPABILITY": "AVX2"
    }
    assert set(os.environ[NUMERICS_SET_VAR].split(",")) == set(REPRODUCIBLE_NUMERICS) - {
        "ATEN_CPU_CAPABILITY"
    }
    pin_numerics("reproducible")  # nothing conflicts
    pin_numerics("native")
    assert [k for k in REPRODUCIBLE_NUMERICS if k in os.environ] == ["ATEN_CPU_CAPABILITY"]
    assert NUMERICS_SET_VAR not in os.environ
    pin_numerics("reproducible")  # back: set again, before the first kernel, and marked as defaults again
    assert all(os.environ[k].upper() == v.upper() for k, v in REPRODUCIBLE_NUMERICS.items())
    pin_numerics("native")
    assert [k for k in REPRODUCIBLE_NUMERICS if k in os.environ] == ["ATEN_CPU_CAPABILITY"]


def test_a_child_process_of_a_defaulted_parent_can_still_go_native(clean_env):
    """``flows.pipeline`` runs ``dvc repro``: a stage inherits the defaults, and ``native`` takes them back there."""
    apply()
    inherited = dict(os.environ)
    clean_env.setattr(os, "environ", inherited)  # the child's environment: the same variables
    apply()
    pin_numerics("native")
    assert not [k for k in REPRODUCIBLE_NUMERICS if k in os.environ]


def test_native_session_env_sets_nothing(clean_env):
    clean_env.setenv(NUMERICS_ENV, "native")
    apply()
    assert not [k for k in REPRODUCIBLE_NUMERICS if k in os.environ]


def test_a_conflicting_variable_or_kernels_chosen_too_early_are_one_line_errors(clean_env):
    apply()
    clean_env.setenv("MKL_CBWR", "AUTO")
    with pytest.raises(
        ConfigError,
        match=r"^model\.cpu_numerics: reproducible pins MKL_CBWR=COMPATIBLE, but the "
        r"environment sets MKL_CBWR=AUTO \(unset it, or run with "
        r"model\.cpu_numerics=native\)$",
    ):
        pin_numerics("reproducible")
    pin_numerics("native")  # native: the user's variable is theirs to set
    assert os.environ["MKL_CBWR"] == "AUTO"
    clean_env.setenv("MKL_CBWR", "COMPATIBLE")
    clean_env.setattr(cpu_numerics, "mkl_cbwr_branch", lambda: "OFF")  # MKL ran before the params were read
    with pytest.raises(ConfigError, match="MKL already runs its OFF branch .* start a new process"):
        pin_numerics("reproducible")
    clean_env.setattr(cpu_numerics, "mkl_cbwr_branch", lambda: "COMPATIBLE")
    clean_env.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(ConfigError, match="ATen already runs its AVX512 kernels"):
        pin_numerics("reproducible")
    assert environment.REPRODUCIBLE_NUMERICS["ATEN_CPU_CAPABILITY"] == "avx2"


# ------------------------------------------------------------------------------------------------
# A short lab run under the kernel levels other CPUs would pick
# ------------------------------------------------------------------------------------------------


def _probe(
    workdir: Path, prepared: Path, env: dict[str, str], *overrides: str
) -> subprocess.CompletedProcess:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in (*REPRODUCIBLE_NUMERICS, NUMERICS_SET_VAR, NUMERICS_ENV)
    }
    full |= env | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "tests" / "numerics_probe.py"), str(workdir), str(prepared), *overrides]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=1800, check=False)


def _numbers(proc: subprocess.CompletedProcess, label: str) -> dict:
    assert proc.returncode == 0, f"{label}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _differences(a: dict, b: dict) -> list[str]:
    keys = ("warmstart", "history", "eval", "weights")
    return [k for k in keys if a[k] != b[k]]


FORCED = [
    {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},  # what MKL picks on an AVX-512 CPU (capped at this CPU's own; on
    # this AMD EPYC, AVX2, what a run without the variable picks too)
    {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},  # a CPU without AVX, for MKL
]


@pytest.mark.slow
def test_a_short_lab_run_gives_the_same_numbers_under_every_forced_kernel_level(tmp_path):
    """Warm start + 2 training steps + evaluation, each in a fresh process with the kernel levels forced: the same
    losses, history, metrics and weights bit for bit. ``ATEN_CPU_CAPABILITY=default`` (a CPU without AVX2) is
    refused in the mode with one line; in ``native`` it runs and changes the numbers (the levels matter)."""
    if (
        cpu_numerics.mkl_cbwr_branch() is None
        or "avx2" not in cpu_numerics.describe("-")["cpu_flags"].split()
    ):
        pytest.skip("needs torch with MKL on an x86-64 CPU with AVX2")
    from flows.prefect_server import shared_api

    with shared_api(timeout_s=600):  # one Prefect API for every run (each would start its own otherwise)
        _short_runs(tmp_path)


def _short_runs(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"
    reference = _numbers(_probe(tmp_path / "reference", prepared, {}), "reference")
    assert (
        reference["numerics"]["mkl_cbwr"] == "COMPATIBLE"
        and reference["numerics"]["aten_capability"] == "AVX2"
    )
    assert reference["eval"] and reference["weights"] and len(reference["history"]) == 2
    for i, env in enumerate(FORCED):
        got = _numbers(_probe(tmp_path / f"forced{i}", prepared, env), str(env))
        assert not _differences(reference, got), f"{env} changed {_differences(reference, got)}"

    refused = _probe(tmp_path / "refused", prepared, {"ATEN_CPU_CAPABILITY": "default"})
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: model.cpu_numerics: reproducible pins ATEN_CPU_CAPABILITY=avx2, but the environment sets "
        "ATEN_CPU_CAPABILITY=default (unset it, or run with model.cpu_numerics=native)"
    )
    native = _probe(
        tmp_path / "native",
        prepared,
        {"ATEN_CPU_CAPABILITY": "default", NUMERICS_ENV: "native"},
        "model.cpu_numerics=native",
    )
    native = _numbers(native, "native, ATen default")
    assert native["numerics"]["mkl_cbwr"] == "OFF" and native["numerics"]["aten_capability"] == "DEFAULT"
    assert "weights" in _differences(reference, native), "the kernel levels did not change a number"


SPLIT_TEST = (
    "tests/core/models/cpu_decode/test_shared_decode.py"
    "::test_two_or_three_decode_processes_give_the_one_process_result_bitwise"
)
LEVELS = [
    {"ATEN_CPU_CAPABILITY": "avx2"},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    {NUMERICS_ENV: "native"},  # MKL's default mode: the decode stays in one process
    {NUMERICS_ENV: "native", "ATEN_CPU_CAPABILITY": "default"},
    {NUMERICS_ENV: "native", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    {NUMERICS_ENV: "native", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
]


@pytest.mark.slow
@pytest.mark.parametrize("env", LEVELS, ids=lambda env: ",".join(f"{k}={v}" for k, v in env.items()))
def test_the_bitwise_decode_split_test_passes_under_every_forced_kernel_level(env):
    """The split decode's claim holds, or is not made (one process), whatever kernels MKL and ATen run."""
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in (*REPRODUCIBLE_NUMERICS, NUMERICS_SET_VAR, NUMERICS_ENV)
    }
    full |= env | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", SPLIT_TEST]
    proc = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-3000:]
