"""``codea1_core.models.cpu_decode.workers``: warm workers run a job on the model's current weights, and go away.

The shared decode's use of it (bitwise the one-process result, failures) is in
``tests/core/models/cpu_decode/test_shared_decode.py``;
here the pool itself, with a tiny linear model: weights followed after in-place updates, the arena grown for a
big job, fresh workers after a config change, no worker left once the model is gone.
"""

from __future__ import annotations

import gc
import os
import select

import pytest
import torch
from transformers import PretrainedConfig

from codea1_core.models.cpu_decode import workers


def apply(model, tensors, meta):
    """A job: the model on the input, times a factor from the settings."""
    return {"y": model(tensors["x"]) * meta["factor"]}, "done"


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.fixture
def forks(monkeypatch):
    pids: list[int] = []
    real_fork = workers.os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(workers.os, "fork", fork)
    yield pids
    workers.close_all()
    assert all(_gone(pid) for pid in pids)


def _model() -> torch.nn.Linear:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 5)
    model.config = PretrainedConfig(flavour=1)
    return model


def _run(pool, model, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    with pool.claim() as mine:
        assert mine
        assert pool.submit(0, {"x": x}, {"factor": factor}, out_bytes=4096)
        outputs, result = pool.result(0, timeout=30)
    assert result == "done"
    return outputs["y"]


def test_a_job_runs_on_the_current_weights_in_one_warm_worker(forks):
    model, x = _model(), torch.randn(3, 8)
    pool = workers.pool_for(model, 1, apply)
    with torch.no_grad():
        assert torch.equal(_run(pool, model, x), model(x) * 2.0)
        model.weight.add_(1.0)  # in place, as an optimizer step
        assert torch.equal(_run(pool, model, x, factor=3.0), model(x) * 3.0)
        model.bias.data = torch.zeros(5)  # a new tensor altogether
        assert torch.equal(_run(pool, model, x), model(x) * 2.0)
    assert len(forks) == 1 and workers.pool_for(model, 1, apply) is pool
    assert workers.pool_for(model, 3, apply) is pool and pool.size == 3  # grown, not forked anew
    assert workers.pool_for(model, 2, apply) is pool and pool.size == 3 and len(forks) == 1


def test_a_job_bigger_than_the_arena_gets_a_bigger_one(forks, monkeypatch):
    monkeypatch.setattr(workers, "ARENA_BYTES", 4096)
    model = _model()
    pool = workers.pool_for(model, 1, apply)
    with torch.no_grad():
        small, big = torch.randn(2, 8), torch.randn(4000, 8)
        assert torch.equal(_run(pool, model, small), model(small) * 2.0)
        assert torch.equal(_run(pool, model, big), model(big) * 2.0)
    assert len(forks) == 2 and _gone(forks[0])


def test_a_config_change_forks_fresh_workers(forks):
    model, x = _model(), torch.randn(3, 8)
    pool = workers.pool_for(model, 1, apply)
    with torch.no_grad():
        _run(pool, model, x)
        model.config.flavour = 2  # Python state a forked copy would not see
        _run(pool, model, x)
    assert len(forks) == 2 and _gone(forks[0])


def test_workers_stop_when_the_model_is_gone(forks):
    model, x = _model(), torch.randn(3, 8)
    pool = workers.pool_for(model, 1, apply)
    with torch.no_grad():
        _run(pool, model, x)
    del model, pool
    gc.collect()
    assert len(forks) == 1 and _gone(forks[0])


def test_a_second_thread_is_told_to_go_alone(forks):
    model = _model()
    pool = workers.pool_for(model, 1, apply)
    with pool.claim() as first, pool.claim() as second:
        assert first and not second


def test_a_worker_holds_none_of_the_callers_files(forks):
    """A pipe the caller opened before the fork sees EOF when the caller closes its end (`make run | tee`)."""
    read_end, write_end = os.pipe()
    model, x = _model(), torch.randn(3, 8)
    pool = workers.pool_for(model, 1, apply)
    with torch.no_grad():
        _run(pool, model, x)  # the worker is forked now, with the pipe open in the caller
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 5.0)
        assert ready and os.read(read_end, 1) == b"", "the worker holds the pipe's write end"  # EOF at once
    finally:
        os.close(read_end)
    assert set(os.listdir(f"/proc/{forks[0]}/fd")) == {"0", "1", "2", str(_worker_socket_fd(forks[0]))}


def _worker_socket_fd(pid: int) -> int:
    """The one descriptor a worker keeps besides /dev/null on 0-2: its socket."""
    fds = [int(fd) for fd in os.listdir(f"/proc/{pid}/fd") if int(fd) > 2]
    assert len(fds) == 1, fds
    assert os.readlink(f"/proc/{pid}/fd/{fds[0]}").startswith("socket:")
    return fds[0]


HOLDER = """
import sys, time, torch
from codea1_core.models.cpu_decode import workers

def slow(model, tensors, meta):
    time.sleep(120)  # a long job: the worker is busy, not waiting for the next message
    return {}, None

model = torch.nn.Linear(4, 4)
pool = workers.pool_for(model, 1, slow)
assert pool.submit(0, {"x": torch.zeros(4)}, {}, 0)
print(workers.worker_pids()[0], flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped counts as gone: it holds no memory and runs nothing)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\\nState:\\tZ" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.e2e
def test_a_busy_worker_dies_with_its_killed_parent(repo_root) -> None:
    """Regression: a worker in a long job outlived its SIGKILLed caller (it looked for its parent only
    between jobs), so a killed run left a decode worker holding its memory."""
    import signal
    import subprocess
    import sys
    import time

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=repo_root, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(holder.stdout.readline())
        time.sleep(1.0)  # in its job now
        assert _alive(pid)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        holder.kill()
        holder.wait()
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
