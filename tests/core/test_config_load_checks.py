"""Values that load but cannot work are refused at load, in one line naming the key and the fix.

Regressions: ``grpo.lr=.inf`` passed the range check and wrote an all-NaN checkpoint with a valid MANIFEST;
``lab.num_heads=3`` failed in 174 lines inside the warm start; ``orchestration.checkpoint_dir=''`` wrote into
the project folder; a wrong ``eval.promote_metric`` failed only at register, after train and evaluate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from codea1_core.config import ConfigError, check_metric_names, load_config, metric_names
from flows.common import stage_main

BAD = [
    ("grpo.lr=.inf", "grpo.lr: must be a finite number, got inf"),
    ("reward.alpha=.nan", "reward.alpha: must be a finite number"),
    ("sandbox.call_timeout_s=.inf", "sandbox.call_timeout_s: must be a finite number"),
    ("lab.num_heads=3", "lab.num_heads: 3 does not divide lab.hidden_size=128"),
    (
        "lab.num_heads=128",
        "lab.num_heads: 128 does not divide lab.hidden_size=128 into heads of an even size",
    ),
    (
        "orchestration.checkpoint_dir=''",
        "orchestration.checkpoint_dir: must name a path other than the project",
    ),
    ("orchestration.checkpoint_dir=.", "orchestration.checkpoint_dir"),
    ("eval.out_dir=' '", "eval.out_dir"),
    ("data.prepared_dir=''", "data.prepared_dir"),
    ("model.code_path=''", "model.code_path"),
    ("tracking.tracking_uri=''", "tracking.tracking_uri"),
]


@pytest.mark.parametrize("override, message", BAD)
def test_values_that_cannot_work_fail_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("params.yaml", [override])


def test_an_empty_tracking_uri_is_fine_without_mlflow() -> None:
    cfg = load_config("params.yaml", ["tracking.backend=null", "tracking.tracking_uri=''"])
    assert cfg.tracking.tracking_uri == ""


@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.promote_metric=code/lab_heldout/base/pass@3", "eval.promote_metric"),
        ("eval.promote_metric=code/humanevalplus/plus/pass@1", "eval.promote_metric"),
        ("eval.promote_metric_test=test/lab_heldout/pass@1", "eval.promote_metric_test"),
    ],
)
def test_a_promotion_metric_the_evaluation_never_writes_is_refused_when_a_stage_loads(
    capsys, override: str, key: str
) -> None:
    ran: list = []
    rc = stage_main(lambda *a: ran.append(a), "test", ["--params", "params.yaml", override])
    err = capsys.readouterr().err
    assert rc == 2 and ran == [] and err.count("\n") == 1 and f"{key}: " in err


def test_the_metric_names_cover_what_the_shipped_evaluation_wrote(repo_root: Path) -> None:
    """Every rate key of the committed ``outputs/eval/metrics.json`` (written by ``make run`` with the shipped
    params) is a name :func:`metric_names` allows, so the load-time check never refuses a real metric."""
    cfg = load_config(repo_root / "params.yaml")
    written = json.loads((repo_root / "outputs/eval/metrics.json").read_text())
    rates = [
        k
        for k in written
        if not k.startswith(("warmstart/", "delta/")) and re.search(r"(pass|avg|mut)@|mul", k.split("/")[-1])
    ]
    assert len(rates) > 50 and not set(rates) - metric_names(cfg.flat())
    check_metric_names(cfg.flat())
    for shipped in sorted((repo_root / "configs").glob("*.yaml")):
        check_metric_names(load_config(shipped).flat(), str(shipped))
