"""Silent config hazards: a params file with a duplicated key loaded "last wins" (a duplicated section once
changed the run's fingerprint and discarded the workspace's checkpoints), and values that only make sense
together (``eval.k_list`` above ``eval.n_samples``) were accepted. Both are now one line at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from codea1_core.config import ConfigError, load_config


def test_a_duplicated_section_is_an_error_naming_the_key_and_both_lines(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("reward:\n  alpha: 0.5\nseed: 3\nreward:\n  alpha: 2.0\n")
    with pytest.raises(ConfigError) as err:
        load_config(params)
    assert str(err.value) == f"{params}: duplicate key 'reward' at line 4 (first at line 1): keep one"


def test_a_duplicated_nested_key_is_an_error_too(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("eval:\n  n_samples: 8\n  k_list: [1, 4]\n  n_samples: 4\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'eval.n_samples' at line 4 \(first at line 2\)"):
        load_config(params)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.k_list=[1, 8, 64]", "eval.k_list[2]: 64 is above eval.n_samples=32 (pass@k needs k <= n)"),
        ("grpo.update_n=9", "grpo.update_n: 9 is above rollout.n_code="),
    ],
)
def test_cross_field_values_are_checked_at_load(tmp_path: Path, override: str, message: str) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("seed: 1\n")
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        load_config(params, [override])


def test_the_shipped_params_and_configs_pass_the_cross_field_checks(repo_root: Path) -> None:
    for path in [repo_root / "params.yaml", *sorted((repo_root / "configs").glob("*.yaml"))]:
        try:
            load_config(path)
        except ConfigError as exc:
            assert "above" not in str(exc) and "duplicate" not in str(exc), exc


def test_a_params_file_is_parsed_once_with_its_duplicate_key_check(tmp_path: Path, monkeypatch) -> None:
    """The duplicate-key check reads the node tree the values are built from: no second YAML pass."""
    import yaml

    def second_pass(*args, **kwargs):
        raise AssertionError("a second YAML parse of the params file")

    monkeypatch.setattr(yaml, "compose", second_pass)
    monkeypatch.setattr(yaml, "safe_load", second_pass)
    params = tmp_path / "params.yaml"
    params.write_text("reward:\n  alpha: 0.25\nseed: 3\n")
    cfg = load_config(params)
    assert (cfg.reward.alpha, cfg.seed) == (0.25, 3)
    params.write_text("reward:\n  alpha: 0.25\nreward:\n  k: 4\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'reward' at line 3 \(first at line 1\)"):
        load_config(params)
