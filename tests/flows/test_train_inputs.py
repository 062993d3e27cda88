"""Bad inputs of ``codea1 train`` are one line naming the file or key, before any work.

Before: a truncated ``train.parquet`` or a missing warm-start model was a 50-145-line traceback; another config's
prepared data was read silently.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from codea1_core.config import Config


def _params(tmp_path: Path, **extra: object) -> Path:
    cfg = Config().replace(
        **{
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "tracking.backend": "null",
            "data.prepared_dir": str(tmp_path / "prepared"),
            "data.train_batch_size": 4,
            "data.train_sources": ["lab"],
            "rollout.max_new_tokens_code": 96,  # within the lab model's 1,024-token context
            "rollout.max_new_tokens_test": 128,
            **extra,
        }
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def test_a_truncated_train_parquet_is_one_line(tmp_path: Path, capsys) -> None:
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import save_prepared
    from flows.common import stage_main
    from flows.train import run

    params = _params(tmp_path)
    parquet = tmp_path / "prepared" / "train.parquet"
    parquet.parent.mkdir()
    save_prepared(lab_problems(Config().lab, "train"), parquet)
    parquet.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])  # cut mid-write
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: {parquet}: not a readable parquet file")
    assert "Traceback" not in err


def test_a_missing_warm_start_model_is_one_line(tmp_path: Path, capsys) -> None:
    from flows.common import stage_main
    from flows.train import run

    missing = tmp_path / "outputs" / "warmstart" / "code"
    params = _params(tmp_path, **{"model.code_path": str(missing)})
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: model.code_path={missing}: no such folder: run the warmstart stage (`dvc repro warmstart`) "
        "or point model.code_path at a model"
    )
    assert "Traceback" not in err


def test_a_hub_model_without_weights_offline_is_one_line_naming_the_key(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A Hub id neither cached nor reachable: one line with the offline route, not the loader's minutes of
    retries and a 277-line traceback."""
    from flows.common import stage_main
    from flows.train import run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = _params(tmp_path, **{"model.code_path": "no-such-org/no-such-model"})
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: model.code_path=no-such-org/no-such-model: not a local folder, not in the")
    assert "huggingface-cli download no-such-org/no-such-model" in last and "Traceback" not in err


def test_another_configs_prepared_data_is_one_line_naming_the_key_and_the_command(
    tmp_path: Path, capsys
) -> None:
    """Regression: the lab's prepared data read by a real-model config was trained on silently (or ended in
    "no training step: 156 problems, data.train_batch_size=256"); now the differing key and the fix are named."""
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import prepared_record, save_prepared
    from flows.common import stage_main
    from flows.train import run

    lab = Config().replace(**{"data.train_sources": ["lab"]})
    parquet = save_prepared(
        lab_problems(lab.lab, "train"), tmp_path / "prepared" / "train.parquet", prepared_record(lab, "train")
    )
    params = _params(tmp_path, **{"data.train_sources": ["mbpp"], "data.train_batch_size": 256})
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: {parquet} was prepared by another config: data.train_sources=['lab'] (this run: ['mbpp']): "
        "prepare this run's data: `dvc repro prepare`, or `codea1 prepare` with this run's params and overrides"
    )
    assert "Traceback" not in err


def test_prepared_data_without_its_record_is_one_line(tmp_path: Path, capsys) -> None:
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import save_prepared
    from flows.common import stage_main
    from flows.train import run

    parquet = save_prepared(lab_problems(Config().lab, "train"), tmp_path / "prepared" / "train.parquet")
    assert stage_main(run, "train", ["--params", str(_params(tmp_path))]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: {parquet}: no record of the data params that prepared it")
    assert last.endswith("`dvc repro prepare`, or `codea1 prepare` with this run's params and overrides")
