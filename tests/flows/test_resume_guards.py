"""Resume never silently does the wrong thing with the workspace's checkpoints.

Before: lowering ``orchestration.max_steps`` below the last checkpoint logged "resuming after iteration 95",
trained nothing and registered the 95-iteration weights again as a new version tagged ``iteration=6``; a
changed training config (a duplicated params section once did it) deleted every checkpoint with one line,
"resuming after iteration 0". Now the first is refused in one line before the flow starts, and the second
says which keys changed and keeps the old checkpoints beside the new ones (``checkpoints.previous``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from codea1_core.config import Config
from codea1_core.method import batches
from workspace import checkpoints, resume


class _Weights:
    """What a policy writes into a checkpoint (the checkpoint layer only calls ``save``)."""

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.bin").write_bytes(b"w" * 64)


def _workspace(tmp_path: Path, cfg: Config, iterations: int) -> Path:
    out = Path(cfg.orchestration.checkpoint_dir)
    fp = batches.config_fingerprint(cfg.flat())
    resume.save_run_info(out, fp, cfg.flat())
    for it in range(1, iterations + 1):
        state = {"fingerprint": fp, "history": [{"iteration": i} for i in range(1, it + 1)]}
        checkpoints.save_checkpoint(out, it, {"code": _Weights()}, None, state, keep=2)
    return out


def _cfg(tmp_path: Path, **extra: object) -> Config:
    return Config().replace(
        **{
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "tracking.backend": "null",
            "data.prepared_dir": str(tmp_path / "prepared"),
            "data.train_sources": ["lab"],
            "data.train_batch_size": 4,
            "rollout.max_new_tokens_code": 96,  # within the lab model's 1,024-token context
            "rollout.max_new_tokens_test": 128,
            **extra,
        }
    )


def test_a_step_budget_below_the_last_checkpoint_is_refused_in_one_line(tmp_path, capsys) -> None:
    from flows.common import stage_main
    from flows.train import run

    cfg = _cfg(tmp_path, **{"orchestration.max_steps": 5})
    out = _workspace(tmp_path, cfg, iterations=5)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.replace(**{"orchestration.max_steps": 3}).to_dict()))
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        f"error: orchestration.max_steps=3 is below the last checkpoint's iteration 5 "
        f"({out / 'checkpoints' / 'it_000005'}): raise it to 5 or more to finish this run, set "
        "orchestration.checkpoint_dir to another folder to train a separate run beside it, or "
        "orchestration.resume=never to start over in this one (its checkpoints are deleted)"
    )
    assert (out / "checkpoints" / "it_000005").is_dir()  # nothing discarded
    with pytest.raises(checkpoints.CheckpointError, match="orchestration.max_steps=3 is below"):
        resume.resume_or_start(out, "auto", batches.config_fingerprint(cfg.flat()), total=3)


def test_a_changed_config_says_what_changed_and_keeps_the_old_checkpoints(tmp_path, caplog) -> None:
    cfg = _cfg(tmp_path)
    out = _workspace(tmp_path, cfg, iterations=2)
    changed = cfg.replace(**{"reward.alpha": 0.25})
    with caplog.at_level(logging.WARNING, logger="codea1.checkpoint"):
        state = resume.resume_or_start(
            out, "auto", batches.config_fingerprint(changed.flat()), 10, changed.flat()
        )
    assert state["iteration"] == 0 and state["path"] is None
    kept = out / "checkpoints.previous"
    assert (kept / "it_000002" / "code" / "weights.bin").is_file()
    assert not (out / "checkpoints" / "it_000002").exists()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "the training config changed (reward.alpha: 0.5 -> 0.25)" in lines[0] and str(kept) in lines[0]
    assert "starting at iteration 0" in lines[0]
