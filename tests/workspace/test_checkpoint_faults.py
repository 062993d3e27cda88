"""Corrupted checkpoints are never trusted.

Before: a truncated weights file failed after 51 s without a path, a truncated ``state.json`` was a bare
``JSONDecodeError``, an empty ``rng.pt`` an ``EOFError`` without message, and 4 KB of zeros inside the weights
resumed silently (exit 0, 28 metrics different from a clean resume).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from codea1_core.atomic import write_json_atomic
from workspace import checkpoints, resume


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
    resume.save_run_info(tmp_path, "fp")
    for it in (1, 2, 3):
        state = {
            "fingerprint": "fp",
            "history": [{"iteration": i} for i in range(1, it + 1)],
        }
        book = write_json_atomic(tmp_path / "mistake_book.json", {"p": it})  # as the merge task writes it
        checkpoints.save_checkpoint(tmp_path, it, {"code": WeightsPolicy(it)}, book, state, keep=keep)
    return checkpoints.ckpt_root(tmp_path)


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
        got = resume.resume_or_start(tmp_path, "auto", "fp")
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
    with pytest.raises(checkpoints.CheckpointError) as err:
        resume.resume_or_start(tmp_path, "auto", "fp")
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
