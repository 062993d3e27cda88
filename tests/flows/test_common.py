"""flows.common: a stage parses its params file once (``stage_config``), however many places ask for it.

How to run: ``pytest tests/flows/test_common.py`` (no Prefect run, a second).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import write_params

import codea1_core.config as config_mod
from codea1_core.config import Config, ConfigError
from flows import common


@pytest.fixture()
def parses(monkeypatch) -> list[str]:
    """The path of every params text parsed from here on."""
    seen: list[str] = []
    real = config_mod.parse_params

    def counted(text: str, path: str | Path) -> dict:
        seen.append(str(path))
        return real(text, path)

    monkeypatch.setattr(config_mod, "parse_params", counted)
    return seen


def test_the_entry_the_run_name_and_the_flow_share_one_parse(tmp_path, parses, monkeypatch) -> None:
    from prefect.runtime import flow_run

    params = write_params(Config(), tmp_path / "params.yaml")
    overrides = ["seed=3", "reward.alpha=0.25"]
    first = common.stage_config(params, overrides)  # the entry's check (stage_main) and the stage's run
    assert common.stage_config(params, list(overrides)) is first
    assert common.flow_config(params, overrides) is first  # the flow's body (no run folder)
    monkeypatch.setattr(flow_run, "get_parameters", lambda: {"params": params, "overrides": overrides})
    monkeypatch.setattr(flow_run, "get_flow_name", lambda: "train")
    assert common.flow_run_name() == "train-codea1-seed3-alpha0.25"  # the flow run's name
    assert parses == [params] and (first.seed, first.reward.alpha) == (3, 0.25)


def test_other_overrides_or_an_edited_file_are_parsed_again(tmp_path, parses) -> None:
    params = write_params(Config(), tmp_path / "params.yaml")
    assert common.stage_config(params, ["seed=3"]).seed == 3
    assert common.stage_config(params).seed == Config().seed
    write_params(Config().replace(seed=7), Path(params))
    assert common.stage_config(params).seed == 7
    assert len(parses) == 3


def test_a_bad_file_raises_its_one_line_every_time(tmp_path, parses) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("reward:\n  alpha: fast\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"reward\.alpha"):
            common.stage_config(str(params))
    with pytest.raises(ConfigError, match="file not found"):
        common.stage_config(str(tmp_path / "missing.yaml"))
    assert len(parses) == 2
