"""Corrupted checkpoints are never trusted; one training run per workspace.

Before: a truncated weights file failed after 51 s without a path, a truncated ``state.json`` was a bare
``JSONDecodeError``, an empty ``rng.pt`` an ``EOFError`` without message, and 4 KB of zeros inside the weights
resumed silently (exit 0, 28 metrics different from a clean resume). Two trainings in one workspace both ran.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks import checkpoint as ckpt


class WeightsPolicy:
    """Saves a counter and 64 KB of "weights" (the real Policy's files are checked the same way)."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def save(self, path: Path) -> Path:
        (path / "model").mkdir(parents=True)
        (path / "value.json").write_text(json.dumps(self.value))
        (path / "model" / "model.safetensors").write_bytes(os.urandom(65536))
        return path

    def load(self, path: Path) -> None:
        self.value = json.loads((path / "value.json").read_text())


def three_iterations(tmp_path: Path, keep: int = 2) -> Path:
    ckpt.save_run_info(tmp_path, "fp", "run-1")
    for it in (1, 2, 3):
        state = {
            "fingerprint": "fp",
            "run_id": "run-1",
            "history": [{"iteration": i} for i in range(1, it + 1)],
        }
        ckpt.save_checkpoint(tmp_path, it, {"code": WeightsPolicy(it)}, {"p": it}, state, keep=keep)
    return ckpt.ckpt_root(tmp_path)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def zero_4k(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8192 : 8192 + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated weights": ("code/model/model.safetensors", truncate),
    "4 KB of zeros inside the weights": ("code/model/model.safetensors", zero_4k),
    "truncated state.json": ("state.json", truncate),
    "empty rng.pt": ("rng.pt", lambda p: p.write_bytes(b"")),
    "deleted policy file": ("code/value.json", lambda p: p.unlink()),
    "manifest gone": ("MANIFEST.json", lambda p: p.unlink()),
}


@pytest.mark.parametrize("what", list(CORRUPTIONS))
def test_a_corrupt_latest_falls_back_to_the_newest_intact_one_with_one_warning(tmp_path, caplog, what):
    root = three_iterations(tmp_path)
    rel, damage = CORRUPTIONS[what]
    damage(root / "it_000003" / rel)
    with caplog.at_level(logging.WARNING, logger="codea1.checkpoint"):
        got = ckpt.resume_or_start(tmp_path, "auto", "fp")
    assert got["iteration"] == 2 and got["book"] == {"p": 2} and got["path"] == root / "it_000002"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "it_000003 is corrupt" in warnings[0] and rel.split("/")[-1] in warnings[0]
    assert "resuming from it_000002" in warnings[0]
    assert (root / "LATEST").read_text() == "it_000002" and not (root / "it_000003").exists()
    pol = WeightsPolicy()
    pol.load(got["path"] / "code")
    assert pol.value == 2


def test_a_workspace_with_only_corrupt_checkpoints_is_one_clear_error_naming_the_file(tmp_path):
    root = three_iterations(tmp_path)
    zero_4k(root / "it_000003" / "code" / "model" / "model.safetensors")
    (root / "it_000002" / "rng.pt").write_bytes(b"")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.resume_or_start(tmp_path, "auto", "fp")
    message = str(err.value)
    assert "\n" not in message and str(root / "it_000003" / "code" / "model" / "model.safetensors") in message
    assert "sha256" in message and "orchestration.resume=never" in message


def test_every_checkpoint_has_a_manifest_of_sizes_and_sha256(tmp_path):
    import hashlib

    root = three_iterations(tmp_path)
    manifest = json.loads((root / "it_000003" / "MANIFEST.json").read_text())
    files = {
        p.relative_to(root / "it_000003").as_posix() for p in (root / "it_000003").rglob("*") if p.is_file()
    }
    assert set(manifest["files"]) == files - {"MANIFEST.json"}
    weights = root / "it_000003" / "code" / "model" / "model.safetensors"
    entry = manifest["files"]["code/model/model.safetensors"]
    assert entry == {"size": 65536, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}


HOLD = "import sys, time; from tasks.checkpoint import WorkspaceLock; WorkspaceLock(sys.argv[1]).acquire(); " \
       "print('held', flush=True); time.sleep(60)"  # fmt: skip


def test_a_second_run_in_the_same_workspace_is_refused_in_one_line(tmp_path, repo_root):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=repo_root, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ckpt.WorkspaceLockedError) as err:
            ckpt.WorkspaceLock(tmp_path).acquire()
        assert (
            f"pid {holder.pid}" in str(err.value)
            and "started" in str(err.value)
            and "\n" not in str(err.value)
        )
    finally:
        holder.kill()
        holder.wait()
    with ckpt.WorkspaceLock(
        tmp_path
    ) as lock:  # the holder died without releasing: a stale lock is taken over
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not lock.path.exists()


def test_a_lock_of_a_pid_reused_by_another_process_is_stale(tmp_path):
    path = tmp_path / ckpt.LOCK_NAME
    import socket

    path.write_text(
        json.dumps({"pid": 1, "host": socket.gethostname(), "proc_start": "0", "started": "then"})
    )
    with ckpt.WorkspaceLock(tmp_path):  # pid 1 is alive, but it is not the process that took the lock
        assert json.loads(path.read_text())["pid"] == os.getpid()


@pytest.mark.e2e
def test_the_train_stage_refuses_a_second_start_in_one_line_before_any_work(tmp_path, repo_root):
    params = tmp_path / "params.yaml"
    out = tmp_path / "train"
    params.write_text(f"orchestration:\n  checkpoint_dir: {out}\ntracking:\n  backend: 'null'\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=repo_root, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "flows.train", "--params", str(params)], cwd=repo_root,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert time.monotonic() - t0 < 60
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    assert (
        second.stderr.strip().count("\n") == 0
        and "another training run holds this workspace" in second.stderr
    )
