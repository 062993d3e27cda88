"""Checkpoints: atomic iteration folders, the LATEST pointer, pruning, fingerprint-guarded resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tasks import checkpoint as ckpt


class FakePolicy:
    """Stands in for ``codea1_core.models.policy.Policy``: save/load a counter (the real one is tested elsewhere)."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True)
        (path / "value.json").write_text(json.dumps(self.value))
        return path

    def load(self, path: Path) -> None:
        self.value = json.loads((path / "value.json").read_text())


def test_save_and_resume_roundtrip(tmp_path: Path) -> None:
    ckpt.save_run_info(tmp_path, "fp", "run-1")
    for it in (1, 2, 3):
        state = {
            "fingerprint": "fp",
            "run_id": "run-1",
            "history": [{"iteration": i} for i in range(1, it + 1)],
        }
        ckpt.save_checkpoint(tmp_path, it, {"code": FakePolicy(it)}, {"problems": {"p": it}}, state, keep=2)
    root = ckpt.ckpt_root(tmp_path)
    assert (root / "LATEST").read_text() == "it_000003"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["it_000002", "it_000003"]
    ckpt.save_checkpoint(
        tmp_path, 4, {"code": FakePolicy(4)}, None, {"fingerprint": "fp", "history": []}, keep=2
    )
    got = ckpt.resume_or_start(tmp_path, "auto", "fp")
    assert got["iteration"] == 4 and got["run_id"] == "run-1" and got["book"] is None
    pol = FakePolicy()
    pol.load(got["path"] / "code")
    assert pol.value == 4


def test_rng_restored(tmp_path: Path) -> None:
    random.seed(7)
    torch.manual_seed(7)
    ckpt.save_checkpoint(tmp_path, 1, {}, None, {"fingerprint": "fp"}, keep=1)
    want = (random.random(), torch.rand(3).tolist())
    random.seed(99)
    torch.manual_seed(99)
    ckpt.load_state(ckpt.latest_checkpoint(tmp_path))
    assert (random.random(), torch.rand(3).tolist()) == want


def test_half_written_iteration_is_ignored(tmp_path: Path) -> None:
    """A kill during save leaves a .tmp folder and an untouched LATEST: resume uses the previous iteration."""
    ckpt.save_run_info(tmp_path, "fp", None)
    ckpt.save_checkpoint(tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []})
    broken = ckpt.ckpt_root(tmp_path) / ".it_000002.tmp"
    broken.mkdir()
    (broken / "garbage").write_text("x")
    got = ckpt.resume_or_start(tmp_path, "auto", "fp")
    assert got["iteration"] == 1
    ckpt.save_checkpoint(tmp_path, 2, {"code": FakePolicy(2)}, None, {"fingerprint": "fp", "history": []})
    assert not broken.exists()


def test_changed_config_or_never_starts_fresh(tmp_path: Path) -> None:
    ckpt.save_run_info(tmp_path, "fp", "run-1")
    ckpt.save_checkpoint(tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []})
    assert ckpt.resume_or_start(tmp_path, "auto", "other")["iteration"] == 0
    assert ckpt.latest_checkpoint(tmp_path) is None
    ckpt.save_run_info(tmp_path, "fp", "run-1")
    ckpt.save_checkpoint(tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []})
    fresh = ckpt.resume_or_start(tmp_path, "never", "fp")
    assert fresh["iteration"] == 0 and fresh["run_id"] is None


def test_corrupt_pointer_is_a_clear_error(tmp_path: Path) -> None:
    root = ckpt.ckpt_root(tmp_path)
    root.mkdir(parents=True)
    (root / "LATEST").write_text("it_000009")
    with pytest.raises(RuntimeError, match="it_000009"):
        ckpt.latest_checkpoint(tmp_path)


def test_history_files(tmp_path: Path) -> None:
    from codea1_core.evaluation.comparison import parse_history

    history = [{"iteration": 1, "code/reward_mean": 0.5}, {"iteration": 2, "x": 1}]
    assert ckpt.write_history(tmp_path, history) == {"iteration": 2, "x": 1}
    lines = (tmp_path / "history.csv").read_text().splitlines()
    assert lines[0] == "iteration,code/reward_mean,x"
    assert lines[1:] == ["1,0.5,", "2,,1"]
    assert parse_history((tmp_path / "history.csv").read_text()) == history  # what the evaluate report reads
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"iteration": 2, "x": 1}
    assert ckpt.write_history(tmp_path / "none", []) == {"iteration": 0}
