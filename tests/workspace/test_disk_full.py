"""A full disk is one line naming the path and "No space left on device", whatever the writer raised.

Before: ``torch.save`` on a full disk raises ``RuntimeError`` ("file write failed"), not an ``OSError``, so the
disk-error handler never saw it: 210 lines, three tracebacks, no "no space left", no path. Here the disk is a
real, small tmpfs (root mounts it; the tests skip with that reason where mounting is impossible).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import mounted_tmpfs


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "256k", "no real full disk to write to") as mnt:
        yield mnt


class _TorchWeights:
    """A policy's checkpoint write as ``Policy.save`` does it: ``torch.save`` of its tensors (the layer above the
    checkpoint; the write and the disk are real)."""

    def save(self, folder: Path) -> None:
        import torch

        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.zeros(512 * 1024)}, folder / "optimizer.pt")  # 2 MiB: more than the disk holds


def test_torch_save_on_a_full_disk_is_an_oserror_naming_the_checkpoint(small_disk: Path) -> None:
    from workspace import checkpoints

    with pytest.raises(OSError) as err:
        checkpoints.save_checkpoint(
            small_disk / "train", 1, {"code": _TorchWeights()}, None, {"fingerprint": "x"}
        )
    assert err.value.errno == errno.ENOSPC, repr(err.value)
    assert str(small_disk / "train" / "checkpoints") in str(err.value.filename)
    assert not any((small_disk / "train" / "checkpoints").glob(".it_*")), "a half-written checkpoint was left"


def test_a_full_disk_under_the_stage_entry_is_one_line(small_disk: Path, tmp_path: Path, capsys) -> None:
    """The stage wrapper (``flows.run_endings.run_guarded``) turns whatever the write raised into the one line."""
    from flows.common import stage_main
    from flows.run_endings import run_guarded
    from workspace import checkpoints

    def start() -> dict:
        checkpoints.save_checkpoint(
            small_disk / "train", 1, {"code": _TorchWeights()}, None, {"fingerprint": "x"}
        )
        return {}

    params = tmp_path / "params.yaml"
    params.write_text(
        "data:\n  train_batch_size: 8\n"
        f"orchestration:\n  checkpoint_dir: {small_disk / 'train'}\ntracking:\n  backend: 'null'\n"
        f"model:\n  code_path: {tmp_path}\n  test_path: {tmp_path}\n"  # a folder: the model check passes
    )

    def run(params: str, overrides: list[str]) -> None:
        from codea1_core.config import load_config

        run_guarded(load_config(params, overrides), start)

    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: {small_disk / 'train' / 'checkpoints'}")
        and "No space left on device" in last
    )
    assert "Traceback" not in err
