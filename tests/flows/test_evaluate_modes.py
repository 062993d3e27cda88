"""Evaluate follows the training mode: selfplay's one model plays both roles; golden has no Test LLM."""

from __future__ import annotations

from pathlib import Path

from codea1_core.config import Config
from flows.evaluate import _evaluate_models, baseline_paths, evaluated_roles, resolve_model_path


def _cfg(tmp_path: Path, mode: str) -> Config:
    return Config().replace(
        **{
            "mode": mode,
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "model.code_path": str(tmp_path / "warm" / "code"),
            "model.test_path": str(tmp_path / "warm" / "test"),
        }
    )


def test_selfplay_evaluates_its_single_model_in_both_roles(tmp_path: Path) -> None:
    """Regression: selfplay's evaluate tried to load outputs/warmstart/test, which selfplay never builds."""
    cfg = _cfg(tmp_path, "selfplay")
    (tmp_path / "train" / "final" / "code").mkdir(parents=True)
    (tmp_path / "warm" / "code").mkdir(parents=True)
    assert resolve_model_path(cfg, "test") == str(tmp_path / "train" / "final" / "code")
    assert baseline_paths(cfg, None, None) == {"code": cfg.model.code_path, "test": cfg.model.code_path}


def test_golden_never_loads_a_test_model(tmp_path: Path) -> None:
    """Regression: golden mode's evaluate failed loading a Test LLM that golden mode does not train."""
    cfg = _cfg(tmp_path, "golden").replace(
        **{"data.eval_benchmarks": [], "eval.test_sources": ["lab_heldout"]}
    )
    (tmp_path / "train" / "final" / "code").mkdir(parents=True)
    (tmp_path / "warm" / "code").mkdir(parents=True)
    assert evaluated_roles(cfg) == ("code",)
    assert baseline_paths(cfg, None, None) == {"code": cfg.model.code_path}

    def no_test_model():
        raise AssertionError("golden mode must not load a Test LLM")

    assert _evaluate_models(cfg, lambda: None, no_test_model, executor=None, mutant_dir=str(tmp_path)) == {}
    assert evaluated_roles(_cfg(tmp_path, "codea1")) == ("code", "test")
