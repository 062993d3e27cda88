"""flows.common: a stage parses its params file once (``stage_config``), however many places ask for it, and
fails at its end when the file was edited while it ran (``check_params_unchanged``).

How to run: ``pytest tests/flows/test_common.py`` (seconds; the e2e test runs a short train stage).
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


# --------------------------------------------------------------------------------------------------
# A params file edited while the stage runs: the stage fails at its end, DVC records nothing
# --------------------------------------------------------------------------------------------------
def _check(tmp_path: Path, before: str, after: str, stage: str = "train") -> None:
    params = tmp_path / "params.yaml"
    params.write_text(after)
    common.check_params_unchanged(params, ["seed=3"], before, stage)


def test_an_edit_of_a_key_the_stage_reads_fails_it_naming_the_key(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the repository's dvc.yaml
    monkeypatch.setenv("DVC_STAGE", "train")
    before = "reward:\n  alpha: 0.5\n"
    _check(tmp_path, before, before)  # unchanged
    _check(tmp_path, before, "reward:\n  alpha: 0.5  # a comment\n")  # same values
    _check(tmp_path, before, before + "seed: 7\n")  # overridden on the command line: not what the stage read
    with pytest.raises(common.UserError) as err:
        _check(tmp_path, before, "reward:\n  alpha: 0.25\n")
    msg = str(err.value)
    assert "\n" not in msg and "reward.alpha: 0.5 -> 0.25" in msg and "dvc repro train" in msg
    with pytest.raises(common.UserError, match="no longer loads"):
        _check(tmp_path, before, "reward:\n  alpha: [\n")


def test_under_dvc_only_the_keys_dvc_yaml_declares_for_the_stage_count(tmp_path, monkeypatch) -> None:
    """DVC records only a stage's declared params: an edit of another stage's key changes nothing it records."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert "reward.alpha" not in common.stage_params("warmstart") and "lab" in common.stage_params(
        "warmstart"
    )
    monkeypatch.setenv("DVC_STAGE", "warmstart")
    _check(tmp_path, "reward:\n  alpha: 0.5\n", "reward:\n  alpha: 0.25\n", "warmstart")
    with pytest.raises(common.UserError, match="lab.warmstart_epochs"):
        _check(tmp_path, "lab:\n  warmstart_epochs: 2\n", "lab:\n  warmstart_epochs: 3\n", "warmstart")
    monkeypatch.delenv("DVC_STAGE")  # outside DVC: every key the config holds
    with pytest.raises(common.UserError, match="reward.alpha"):
        _check(tmp_path, "reward:\n  alpha: 0.5\n", "reward:\n  alpha: 0.25\n", "warmstart")


@pytest.mark.e2e
def test_a_params_edit_during_a_real_train_stage_fails_it_in_one_line(
    prefect_harness, tiny_model_dir, tmp_path, repo_root
) -> None:
    """``reward.alpha`` edited while train ran: MLflow kept the old value, DVC recorded the new one and the next
    ``make run`` said "up to date". Now the stage exits 2 at its end naming the key, so DVC records nothing."""
    import os
    import subprocess
    import sys
    import time

    import yaml
    from prefect.settings import PREFECT_API_URL
    from support import tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, **{"orchestration.max_steps": 4, "data.epochs": 4})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=str(PREFECT_API_URL.value()), DVC_STAGE="train"
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.train", "--params", str(params)],
        cwd=repo_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    latest = tmp_path / "train" / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 300
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    params.write_text(params.read_text().replace("alpha: 0.5", "alpha: 0.25"))  # after the first step
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {params} changed while the train stage ran (reward.alpha: 0.5 -> 0.25)")
    assert "Traceback" not in err
    assert (tmp_path / "train" / "final" / "DONE.json").is_file()  # it trained to the end with the old value
