"""Register stage: champion only when the evaluation beats the current champion, else candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import write_done

from codea1_core.config import Config
from flows.common import UserError
from flows.register import metric_value, register
from tasks.register import decide
from tracking import packaging, registry
from tracking.results import training_run_id
from tracking.runs import MlflowTracker


@pytest.fixture()
def cfg(mlflow_cfg: Config, tmp_path: Path) -> Config:
    return mlflow_cfg.replace(
        **{
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "eval.promote_metric": "code/lab_heldout/pass@1",
        }
    )


@pytest.fixture(autouse=True)
def fast_model_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """The promotion logic does not need real MLflow models (tests/tracking/test_packaging.py loads those): a
    marker file."""
    monkeypatch.setattr(packaging, "save_transformers_model", lambda src, out, role, step: _marker(out))


def _marker(out: Path) -> Path:
    out.mkdir(parents=True)
    (out / "MLmodel").write_text("flavors: {}\n")
    return out


def _train_and_eval(
    cfg: Config,
    tmp_path: Path,
    value: float,
    test: float | None = None,
    warm: dict | None = None,
    roles: tuple[str, ...] = ("code", "test"),
) -> Path:
    """What the train + evaluate stages leave behind: registered versions, DONE.json, eval metrics."""
    tr = MlflowTracker(cfg)
    versions = {role: tr.register(role, tmp_path, 1) for role in roles}
    write_done(Path(cfg.orchestration.checkpoint_dir), versions, tr.run_id)
    eval_path = tmp_path / "eval.json"
    metrics = {"code/lab_heldout/pass@1": value, "test/lab_heldout/pass@5": value if test is None else test}
    eval_path.write_text(json.dumps({**metrics, **(warm or {}), "other": 1}))
    return eval_path


def test_promotion_sequence(cfg: Config, tmp_path: Path) -> None:
    out = tmp_path / "register.json"
    first = register(cfg, _train_and_eval(cfg, tmp_path, 0.40), out)
    assert first["decision"] == "champion" and first["champion_value"] is None
    assert registry.alias_info(cfg, "codea1-code", "champion")["version"] == "1"
    worse = register(cfg, _train_and_eval(cfg, tmp_path, 0.30), out)
    assert worse["decision"] == "candidate" and worse["champion_value"] == pytest.approx(0.40)
    assert registry.alias_info(cfg, "codea1-code", "champion")["version"] == "1"
    assert registry.alias_info(cfg, "codea1-code", "candidate")["version"] == "2"
    assert json.loads(out.read_text())["decision"] == "candidate"
    better = register(cfg, _train_and_eval(cfg, tmp_path, 0.55), out)
    assert better["decision"] == "champion" and better["models"]["test"]["alias"] == "champion"
    assert registry.alias_info(cfg, "codea1-test", "champion")["version"] == "3"
    # the decision is logged to the training run
    run_id = training_run_id(cfg)
    run = MlflowTracker(cfg, run_id=run_id).client.get_run(run_id)
    assert run.data.metrics["register/new"] == pytest.approx(0.55)
    assert run.data.metrics["register/promoted"] == 1.0


def test_equal_number_is_not_promoted() -> None:
    assert decide(0.5, 0.5)[0] == "candidate"
    assert decide(0.5, None)[0] == "champion"
    assert decide(0.5, None, 0.5) == ("candidate", "0.5 does not beat its warm start 0.5")
    assert decide(0.6, 0.4, 0.5)[0] == "champion"


def test_each_role_on_its_own_metric_and_never_without_beating_its_warm_start(
    cfg: Config, tmp_path: Path
) -> None:
    """Regression: the Test LLM was promoted on a code metric, and +0.0 over the warm start
    became champion."""
    out = tmp_path / "register.json"
    warm = {"warmstart/code/lab_heldout/pass@1": 0.40, "warmstart/test/lab_heldout/pass@5": 0.10}
    first = register(cfg, _train_and_eval(cfg, tmp_path, 0.40, test=0.30, warm=warm), out)
    code, test = first["models"]["code"], first["models"]["test"]
    assert (code["alias"], code["metric"]) == ("candidate", "code/lab_heldout/pass@1")  # +0.0: no champion
    assert "warm start" in code["reason"] and code["warmstart_value"] == pytest.approx(0.40)
    assert (test["alias"], test["metric"], test["new"]) == ("champion", "test/lab_heldout/pass@5", 0.30)
    assert registry.alias_info(cfg, "codea1-code", "champion") is None
    info = registry.alias_info(cfg, "codea1-test", "champion")
    assert info["version"] == "1" and info["tags"]["register.decision"].startswith("champion: 0.3 beats")
    # a golden run registers no Test LLM: the older codea1-test version is not judged again
    golden = register(cfg, _train_and_eval(cfg, tmp_path, 0.50, test=0.0, warm=warm, roles=("code",)), out)
    assert set(golden["models"]) == {"code"} and golden["decision"] == "champion"
    assert registry.alias_info(cfg, "codea1-test", "champion")["version"] == "1"
    saved = json.loads(out.read_text())
    assert saved["models"]["code"]["reason"].startswith("0.5 beats")


def test_metric_lookup_errors(tmp_path: Path) -> None:
    src = tmp_path / "m.json"
    assert metric_value({"code": {"he": {"pass@1": 0.2}}}, "code/he/pass@1", src) == 0.2
    with pytest.raises(UserError, match="m.json: metric 'code/x' .*not found"):
        metric_value({"code": {}}, "code/x", src)
    with pytest.raises(UserError, match="not a number"):
        metric_value({"a": "high"}, "a", src)


def test_missing_eval_file_is_a_user_error(cfg: Config, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="run the evaluate stage"):
        register(cfg, tmp_path / "nope.json", tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
