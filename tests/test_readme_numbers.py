"""The README states the default run's learning numbers exactly as the committed outputs say (issue 17, item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flows import readme_numbers


def test_readme_matches_the_committed_outputs(repo_root: Path) -> None:
    """Fails when `make run` rewrote outputs/eval/metrics.json but the README still quotes the old numbers."""
    assert readme_numbers.main(["--check"], repo=repo_root) == 0


def _scratch(repo_root: Path, tmp_path: Path) -> Path:
    (tmp_path / "outputs" / "eval").mkdir(parents=True)
    for rel in ["README.md", "params.yaml", "outputs/eval/metrics.json"]:
        shutil.copy(repo_root / rel, tmp_path / rel)
    return tmp_path


def test_drift_is_detected_then_rewritten(repo_root: Path, tmp_path: Path, capsys) -> None:
    repo = _scratch(repo_root, tmp_path)
    metrics_path = repo / "outputs" / "eval" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    key = readme_numbers.HEADLINE
    metrics[key], metrics[f"delta/{key}"] = 99.0, 99.0 - metrics[f"warmstart/{key}"]
    metrics_path.write_text(json.dumps(metrics))

    assert readme_numbers.main(["--check"], repo=repo) == 1
    assert "make readme-numbers" in capsys.readouterr().out
    assert readme_numbers.main([], repo=repo) == 0
    text = (repo / "README.md").read_text()
    assert f"→ 99 (+{99.0 - metrics[f'warmstart/{key}']:.1f})**" in text
    assert readme_numbers.main(["--check"], repo=repo) == 0
    assert text.count(readme_numbers.BEGIN) == 1  # rewritten in place, nothing duplicated


def test_missing_markers_is_one_clear_line(repo_root: Path, tmp_path: Path) -> None:
    repo = _scratch(repo_root, tmp_path)
    (repo / "README.md").write_text("# no markers\n")
    try:
        readme_numbers.main(["--check"], repo=repo)
    except SystemExit as exc:
        assert "markers" in str(exc) and "README.md" in str(exc)
    else:
        raise AssertionError("missing markers must be an error")
