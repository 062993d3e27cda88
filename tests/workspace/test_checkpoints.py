"""Checkpoints: atomic iteration folders, the LATEST pointer, pruning, fingerprint-guarded resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from codea1_core.atomic import write_json_atomic
from workspace import checkpoints, resume


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
    resume.save_run_info(tmp_path, "fp")
    for it in (1, 2, 3):
        state = {
            "fingerprint": "fp",
            "history": [{"iteration": i} for i in range(1, it + 1)],
        }
        book = write_json_atomic(tmp_path / "mistake_book.json", {"problems": {"p": it}})  # the merge's out
        checkpoints.save_checkpoint(tmp_path, it, {"code": FakePolicy(it)}, book, state, keep=2)
    root = checkpoints.ckpt_root(tmp_path)
    assert (
        root / "it_000003" / "mistake_book.json"
    ).read_bytes() == book.read_bytes()  # copied, not rewritten
    assert (root / "LATEST").read_text() == "it_000003"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["it_000002", "it_000003"]
    checkpoints.save_checkpoint(
        tmp_path, 4, {"code": FakePolicy(4)}, None, {"fingerprint": "fp", "history": []}, keep=2
    )
    got = resume.resume_or_start(tmp_path, "auto", "fp")
    assert got["iteration"] == 4 and got["continues"] and got["book"] is None
    pol = FakePolicy()
    pol.load(got["path"] / "code")
    assert pol.value == 4


def test_torch_rng_restored(tmp_path: Path) -> None:
    torch.manual_seed(7)
    checkpoints.save_checkpoint(tmp_path, 1, {}, None, {"fingerprint": "fp"}, keep=1)
    want = torch.rand(3).tolist()
    torch.manual_seed(99)
    checkpoints.load_state(checkpoints.latest_checkpoint(tmp_path))
    assert torch.rand(3).tolist() == want


def test_a_checkpoint_does_not_depend_on_pythons_global_rng(tmp_path: Path) -> None:
    """Libraries draw from Python's global RNG at moments that vary per run (retry jitter): a checkpoint holding
    its state differed between two runs of the same inputs, and so did ``dvc.lock``."""
    manifests = []
    for seed in (1, 2):
        random.seed(seed)
        torch.manual_seed(7)
        folder = checkpoints.save_checkpoint(tmp_path / str(seed), 1, {}, None, {"fingerprint": "fp"}, keep=1)
        manifests.append((folder / "MANIFEST.json").read_text())
    assert manifests[0] == manifests[1]


def test_half_written_iteration_is_ignored(tmp_path: Path) -> None:
    """A kill during save leaves a .tmp folder and an untouched LATEST: resume uses the previous iteration."""
    resume.save_run_info(tmp_path, "fp")
    checkpoints.save_checkpoint(
        tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []}
    )
    broken = checkpoints.ckpt_root(tmp_path) / ".it_000002.tmp"
    broken.mkdir()
    (broken / "garbage").write_text("x")
    got = resume.resume_or_start(tmp_path, "auto", "fp")
    assert got["iteration"] == 1
    checkpoints.save_checkpoint(
        tmp_path, 2, {"code": FakePolicy(2)}, None, {"fingerprint": "fp", "history": []}
    )
    assert not broken.exists()


def test_changed_config_or_never_starts_fresh(tmp_path: Path) -> None:
    resume.save_run_info(tmp_path, "fp")
    checkpoints.save_checkpoint(
        tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []}
    )
    assert resume.resume_or_start(tmp_path, "auto", "other")["iteration"] == 0
    assert checkpoints.latest_checkpoint(tmp_path) is None
    resume.save_run_info(tmp_path, "fp")
    checkpoints.save_checkpoint(
        tmp_path, 1, {"code": FakePolicy(1)}, None, {"fingerprint": "fp", "history": []}
    )
    fresh = resume.resume_or_start(tmp_path, "never", "fp")
    assert fresh["iteration"] == 0 and not fresh["continues"]


def test_corrupt_pointer_is_a_clear_error(tmp_path: Path) -> None:
    root = checkpoints.ckpt_root(tmp_path)
    root.mkdir(parents=True)
    (root / "LATEST").write_text("it_000009")
    with pytest.raises(RuntimeError, match="it_000009"):
        checkpoints.latest_checkpoint(tmp_path)
