"""``model.cpu_threads``: every flow pins torch's CPU threads, because the count changes the numbers.

CPU kernels split their sums by thread count, so the lab's seed-1 warm start gives other numbers with 1 thread
than with 2 (``bench/warmstart_seeds.py``); a pinned count makes other machines' core counts reproduce them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from codea1_core.config import ConfigError, load_config
from flows.common import flow_config, load_stage_config, pin_cpu_threads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_threads(monkeypatch: pytest.MonkeyPatch):
    import torch

    before = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    yield
    torch.set_num_threads(before)


def test_params_pin_the_lab_to_two_threads() -> None:
    assert load_config(REPO / "params.yaml").model.cpu_threads == 2


def test_flow_config_pins_torch_and_the_environment(restore_threads: None) -> None:
    import torch

    torch.set_num_threads(2)
    flow_config(str(REPO / "params.yaml"), ["model.cpu_threads=1"])
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "1"
    seen: list[int] = []  # Prefect runs tasks in worker threads: they must see the same count
    worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    worker.start()
    worker.join()
    assert seen == [1]


def test_zero_leaves_torch_alone(restore_threads: None) -> None:
    import torch

    torch.set_num_threads(1)
    pin_cpu_threads(load_config(REPO / "params.yaml", ["model.cpu_threads=0"]))
    assert torch.get_num_threads() == 1
    assert "OMP_NUM_THREADS" not in os.environ


def test_torch_imported_later_reads_the_pinned_count(tmp_path: Path) -> None:
    code = (
        "import sys; from flows.common import pin_cpu_threads; from codea1_core.config import load_config\n"
        "assert 'torch' not in sys.modules\n"
        f"pin_cpu_threads(load_config({str(REPO / 'params.yaml')!r}, ['model.cpu_threads=1']))\n"
        "import torch; print(torch.get_num_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def test_negative_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="model.cpu_threads"):
        load_config(REPO / "params.yaml", ["model.cpu_threads=-1"])


def test_cli_commands_outside_flows_pin_too(restore_threads: None) -> None:
    """``codea1 solve`` / ``codea1 attack`` run models without a flow: their config loader pins as well."""
    import torch

    torch.set_num_threads(2)
    load_stage_config(str(REPO / "params.yaml"), ["model.cpu_threads=1"])
    assert torch.get_num_threads() == 1
