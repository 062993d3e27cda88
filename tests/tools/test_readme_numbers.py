"""The README and docs/results.md state their measured numbers exactly as the committed outputs say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools import readme_numbers


def test_readme_matches_the_committed_outputs(repo_root: Path) -> None:
    """Fails when `make run` / `make lab-compare` results changed but a document still quotes the old numbers."""
    assert readme_numbers.main(["--check"], repo=repo_root) == 0


def _scratch(repo_root: Path, tmp_path: Path) -> Path:
    """The documents with generated blocks, params, the make-run metrics and the lab-compare results, copied."""
    (tmp_path / "outputs" / "eval").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for rel in [*readme_numbers.FILES, "params.yaml", "outputs/eval/metrics.json"]:
        shutil.copy(repo_root / rel, tmp_path / rel)
    lab = readme_numbers.LAB_COMPARE
    shutil.copytree(repo_root / lab, tmp_path / lab, ignore=shutil.ignore_patterns("*.png", "history.*"))
    return tmp_path


def test_drift_is_detected_then_rewritten(repo_root: Path, tmp_path: Path, capsys) -> None:
    repo = _scratch(repo_root, tmp_path)
    metrics_path = repo / "outputs" / "eval" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    key = readme_numbers.HEADLINE
    metrics[key], metrics[f"delta/{key}"] = 99.0, 99.0 - metrics[f"warmstart/{key}"]
    metrics_path.write_text(json.dumps(metrics))

    assert readme_numbers.main(["--check"], repo=repo) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        "make readme-numbers" in last and "README.md learning" in last and "docs/results.md learning" in last
    )
    assert readme_numbers.main([], repo=repo) == 0
    warm = metrics[f"warmstart/{key}"]
    row = f"| {readme_numbers._num(warm)} | 99 | **{99.0 - warm:+.1f}** |"
    for rel in readme_numbers.FILES:
        text = (repo / rel).read_text()
        assert row in text, rel
        assert text.count(readme_numbers.BEGIN) == 1  # rewritten in place, nothing duplicated
    assert readme_numbers.main(["--check"], repo=repo) == 0


@pytest.mark.parametrize("rel", list(readme_numbers.FILES))
def test_a_hand_edited_block_in_any_document_fails_the_check(repo_root, tmp_path, capsys, rel) -> None:
    """The outputs did not change, but one document's generated block did: the check names that file."""
    repo = _scratch(repo_root, tmp_path)
    path = repo / rel
    text = path.read_text()
    start = text.index(readme_numbers.BEGIN)
    edited = text[:start] + text[start:].replace("| **", "| **9", 1)  # the headline's delta, by hand
    assert edited != text
    path.write_text(edited)
    assert readme_numbers.main(["--check"], repo=repo) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"{rel} learning" in last and [r for r in readme_numbers.FILES if r != rel][0] not in last
    assert readme_numbers.main([], repo=repo) == 0 and path.read_text() == text


def test_a_changed_lab_compare_result_changes_the_seeds_and_table_blocks(repo_root, tmp_path, capsys) -> None:
    repo = _scratch(repo_root, tmp_path)
    lab = repo / readme_numbers.LAB_COMPARE
    table = json.loads((lab / "table.json").read_text())
    name = next(
        n
        for n, e in table["experiments"].items()
        if e["mode"] == readme_numbers.DEFAULT_ARM and e["seed"] == 2
    )
    path = lab / "runs" / name / "metrics.json"
    metrics = json.loads(path.read_text())
    key = readme_numbers.HEADLINE
    metrics[key], metrics[f"delta/{key}"] = 88.0, 88.0 - metrics[f"warmstart/{key}"]
    path.write_text(json.dumps(metrics))
    (lab / "table.md").write_text((lab / "table.md").read_text() + "\none more line\n")

    assert readme_numbers.main(["--check"], repo=repo) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        "docs/results.md seeds" in last and "docs/results.md lab-compare" in last and "learning" not in last
    )
    assert readme_numbers.main([], repo=repo) == 0
    text = (repo / "docs" / "results.md").read_text()
    assert f"→ 88 (**{88.0 - metrics[f'warmstart/{key}']:+.1f}**)" in text and "one more line" in text
    assert readme_numbers.main(["--check"], repo=repo) == 0


def test_seed_summary_is_the_mean_and_range_of_the_gains() -> None:
    key = readme_numbers.HEADLINE
    others = [
        "code/lab_heldout/base/pass@1",
        "test/lab_heldout/pass@5",
        "test/lab_heldout/mut@5",
        "code/lab_heldout_seen/sparse/pass@1",
    ]

    def run(warm: float, trained: float) -> dict:
        m = {key: trained, f"warmstart/{key}": warm, f"delta/{key}": trained - warm}
        m["test/lab_heldout/mut@5_all"] = 1.0
        for k in others:
            m[k], m[f"warmstart/{k}"] = 2.0, 1.0
        return m

    text = readme_numbers.render_seeds({1: run(40, 52), 2: run(40, 60), 3: run(30, 40)}, "abc1234")
    prose = " ".join(line for line in text.splitlines() if not line.startswith("|"))  # wrapped at 118
    prose = " ".join(prose.split())
    assert "mean **+14.0**, from +10.0 to +20.0, sample std 5.3" in prose
    assert "warm start 40 / 40 / 30 (lowest / median 0.75)" in prose
    assert "at `abc1234`" in prose and text.count("\n| ") == 4  # header + 3 seeds


@pytest.mark.parametrize("rel", list(readme_numbers.FILES))
def test_missing_markers_is_one_clear_line(repo_root: Path, tmp_path: Path, rel: str) -> None:
    repo = _scratch(repo_root, tmp_path)
    (repo / rel).write_text("# no markers\n")
    with pytest.raises(SystemExit) as exc:
        readme_numbers.main(["--check"], repo=repo)
    assert "markers" in str(exc.value) and rel in str(exc.value)


def test_missing_results_name_the_command_that_makes_them(repo_root: Path, tmp_path: Path) -> None:
    repo = _scratch(repo_root, tmp_path)
    (repo / readme_numbers.LAB_COMPARE / "table.json").unlink()
    with pytest.raises(SystemExit) as exc:
        readme_numbers.main(["--check"], repo=repo)
    assert "make lab-compare" in str(exc.value) and "table" in str(exc.value)
