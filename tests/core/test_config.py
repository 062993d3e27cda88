"""Config: params.yaml -> frozen dataclasses; bad input fails with one line naming the dotted key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from codea1_core.config import Config, ConfigError, apply_overrides, load_config


def test_repo_params_load_and_match_defaults_where_unset(repo_root: Path) -> None:
    cfg = load_config(repo_root / "params.yaml")
    assert cfg.mode == "codea1"
    # docs/method.md §19 defaults that params.yaml does not change
    assert cfg.reward.alpha == 0.5 and cfg.reward.k == 8 and cfg.reward.adv_mode == "official"
    assert cfg.grpo.clip_low == 0.2 and cfg.grpo.clip_high == 0.28 and cfg.grpo.dual_clip_c == 10.0
    assert cfg.grpo.kl_coef == 0.001 and cfg.grpo.update_n == 1
    assert cfg.mistake_book.top_k == 8 and cfg.mistake_book.max_per_problem == 64
    assert cfg.sandbox.call_timeout_s == 2.0 and cfg.sandbox.float_rel_tol == 1e-6
    assert cfg.tests.parse_mode == "strict"


def test_defaults_follow_algorithm_md() -> None:
    cfg = Config()
    assert (cfg.data.train_batch_size, cfg.rollout.n_code, cfg.rollout.n_tests) == (256, 8, 8)
    assert (cfg.eval.n_samples, cfg.eval.temperature, cfg.eval.top_p) == (32, 0.7, 0.95)
    assert cfg.sandbox.program_cap_s == 60.0 and cfg.sandbox.max_infra_failure_frac == 0.1
    assert cfg.mistake_book.tie_break == "recent" and cfg.grpo.skip_zero_variance_groups is False


def test_every_field_has_a_docstring(repo_root: Path) -> None:
    """Each config field is documented by a string literal right after it (CleanRL style)."""
    import ast

    tree = ast.parse((repo_root / "codea1_core" / "config.py").read_text())
    missing = []
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Config")]:
        if cls.name == "Config":
            continue
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)):
                    missing.append(f"{cls.name}.{node.target.id}")
    assert not missing, missing


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"reward": {"alpha": "0.5x"}}, "reward.alpha: expected float, got str '0.5x'"),
        ({"grpo": {"adv_eps": "1e-6"}}, "grpo.adv_eps: expected float, got str '1e-6' (YAML reads 1e-6"),
        ({"reward": {"alpha": 0.5, "beta": 1}}, "reward.beta: unknown key"),
        ({"nonsense": 1}, "nonsense: unknown key"),
        ({"mode": "duel"}, "mode: expected one of ['codea1', 'golden', 'selfplay'], got str 'duel'"),
        ({"rollout": {"n_code": 2.5}}, "rollout.n_code: expected int, got float 2.5"),
        ({"rollout": {"n_code": True}}, "rollout.n_code: expected int, got bool True"),
        ({"data": {"train_sources": ["lab", 3]}}, "data.train_sources[1]: expected str, got int 3"),
        ({"sandbox": 5}, "sandbox: expected a mapping (section), got int 5"),
        (
            {"lab": {"golden_tests": "dense"}},
            "lab.golden_tests: expected one of ['sparse', 'boundary'], got str 'dense'",
        ),
    ],
)
def test_from_dict_names_the_dotted_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_dict(raw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_yaml_1e_minus_6_is_rejected_with_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("sandbox:\n  float_rel_tol: 1e-6\n")
    assert yaml.safe_load(path.read_text())["sandbox"]["float_rel_tol"] == "1e-6"  # the PyYAML trap itself
    with pytest.raises(
        ConfigError, match=r"params.yaml: sandbox.float_rel_tol: expected float, got str '1e-6'"
    ):
        load_config(path)


def test_ints_are_accepted_for_floats_and_config_is_frozen() -> None:
    cfg = Config.from_dict({"reward": {"alpha": 1}})
    assert cfg.reward.alpha == 1.0 and isinstance(cfg.reward.alpha, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.reward.alpha = 0.3  # type: ignore[misc]


def test_overrides_go_through_the_same_validation() -> None:
    cfg = apply_overrides(
        Config(), ["reward.alpha=0.25", "mistake_book.enabled=false", "data.train_sources=[lab, mbpp]"]
    )
    assert cfg.reward.alpha == 0.25 and cfg.mistake_book.enabled is False
    assert cfg.data.train_sources == ["lab", "mbpp"]
    with pytest.raises(ConfigError, match="reward.alpha: expected float, got str '0.5x'"):
        apply_overrides(Config(), ["reward.alpha=0.5x"])
    with pytest.raises(ConfigError, match="reward.gamma: unknown key"):
        apply_overrides(Config(), ["reward.gamma=1"])
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides(Config(), ["reward.alpha"])
    assert Config().replace(**{"reward.alpha": 0.75}).reward.alpha == 0.75


def test_round_trip_and_flat() -> None:
    cfg = Config.from_dict({"reward": {"alpha": 0.25}, "mode": "golden"})
    assert Config.from_dict(cfg.to_dict()) == cfg
    flat = cfg.flat()
    assert flat["reward.alpha"] == 0.25 and flat["mode"] == "golden"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("reward:\n  alpha: 0.5x\n", "reward.alpha: expected float, got str '0.5x'"),
        ("reward:\n  alpah: 0.5\n", "reward.alpah: unknown key"),
        ("grpo:\n  lr: 1e-6\n", "grpo.lr: expected float, got str '1e-6'"),
        ("reward: [1, 2\n", "invalid YAML"),
    ],
)
def test_cli_fails_with_one_line_naming_the_key(tmp_path: Path, content: str, expected: str) -> None:
    """A user's malformed params.yaml ends in one stderr line and exit code 2 — no traceback."""
    params = tmp_path / "params.yaml"
    params.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "train", "--params", str(params)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
