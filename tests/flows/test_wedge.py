"""A failed or killed train stage never wedges ``dvc repro``.

Before: a kill inside train's ``finish()`` (after the last checkpoint, before ``DONE.json``), or a failed start
after a params typo, left every later ``dvc repro`` failing with ``output 'outputs/train/metrics.jsonl' does
not exist``: DVC deletes a stage's non-persistent outs before re-running it, and a resumed train with no
iteration left never rewrote them; each try also registered another model version.

Here a real DVC repo in ``tmp_path`` holds the real train stage's outs (a tiny model, 2 steps); the train
process is SIGKILLed at each point of ``finish()`` (``$CODEA1_KILL_AT``, ``flows.train.fault_point``), then a
params typo fails a start; after each, the next ``dvc repro`` must complete with one model version per role.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import build_tiny, make_repo

from codea1_core.evaluation.comparison import parse_history

KILL_POINTS = [
    "finish:history",
    "finish:export_code",
    "finish:register_code",
    "finish:export_test",
    "finish:register_test",
    "finish:done",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def repro(repo: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["dvc", "repro"], cwd=repo, env=dict(env, **extra), capture_output=True, text=True, timeout=600
    )


def versions(repo: Path, name: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(
        tracking_uri=f"sqlite:///{repo}/mlflow.db", registry_uri=f"sqlite:///{repo}/mlflow.db"
    )
    return [int(v.version) for v in client.search_model_versions(f"name = '{name}'")]


@pytest.mark.timeout(1500)  # dvc repro runs of up to 600 s each
@pytest.mark.e2e
@pytest.mark.parametrize(
    "points",
    [
        pytest.param(["finish:register_code"], id="killed_after_registering"),
        pytest.param(KILL_POINTS, id="every_point", marks=pytest.mark.slow),  # ~8 min on 2 busy cores
    ],
)
def test_kills_inside_finish_and_a_failed_start_never_wedge_dvc_repro(
    prefect_harness, tiny_model, tmp_path, repo_root, points
):
    repo = tmp_path / "repo"
    env = make_repo(repo, tiny_model, repo_root)
    for point in points:
        killed = repro(repo, env, CODEA1_KILL_AT=point)
        assert killed.returncode != 0, (point, killed.stdout[-2000:], killed.stderr[-2000:])
    done = repro(repo, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = repo / "outputs" / "train"
    assert [r["iteration"] for r in parse_history((out / "history.csv").read_text())] == [1, 2]
    assert (out / "final" / "code" / "config.json").is_file() and (out / "final" / "DONE.json").is_file()
    assert versions(repo, "codea1-code") == [1] and versions(repo, "codea1-test") == [1]

    params = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(
        params.replace("  alpha: 0.5", "  alphaa: 0.5")
    )  # a misspelt key: the stage must refuse it
    typo = repro(repo, env)
    assert typo.returncode != 0 and "reward.alphaa: unknown key" in typo.stdout + typo.stderr
    (repo / "params.yaml").write_text(params)
    fixed = repro(repo, env)
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    assert (out / "history.csv").is_file() and (out / "final" / "test" / "config.json").is_file()
    assert versions(repo, "codea1-code") == [1] and versions(repo, "codea1-test") == [1], fixed.stdout[-3000:]
    status = subprocess.run(["dvc", "status"], cwd=repo, env=env, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout
