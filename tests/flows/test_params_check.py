"""The ``params`` stage (``flows/params_check.py``): what it refuses before DVC removes any stage's outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from codea1_core.config import ConfigError
from flows.params_check import OUTPUT, check

REPO = Path(__file__).resolve().parents[2]


def _params(tmp_path: Path, **eval_keys: object) -> str:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["eval"].update(eval_keys)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return str(path)


def test_the_projects_params_pass_and_write_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(_params(tmp_path), [])
    first = OUTPUT.read_bytes()
    check(_params(tmp_path), ["reward.alpha=0.75"])
    assert OUTPUT.read_bytes() == first


def test_a_promotion_metric_no_stage_writes_is_refused_before_any_stage(tmp_path, monkeypatch):
    """Regression: a typo in ``eval.promote_metric`` surfaced only at register, after train and evaluate."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="eval.promote_metric"):
        check(_params(tmp_path, promote_metric="code/lab_heldout/pass@1_typo"), [])
    assert not OUTPUT.exists()
