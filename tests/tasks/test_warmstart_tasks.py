"""The warm start's tasks: each role fine-tunes for its own number of epochs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from codea1_core.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_code_epochs_apart_from_the_test_role():
    from tasks.warmstart import epochs_of

    lab = load_config(REPO / "params.yaml", ["lab.warmstart_epochs=6", "lab.warmstart_code_epochs=12"]).lab
    assert (epochs_of(lab, "code"), epochs_of(lab, "test")) == (12, 6)
    same = replace(lab, warmstart_code_epochs=0)  # 0: both roles follow lab.warmstart_epochs
    assert (epochs_of(same, "code"), epochs_of(same, "test")) == (6, 6)
