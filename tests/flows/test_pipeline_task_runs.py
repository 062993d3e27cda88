"""``make run`` records task runs: every stage's flow run shows its tasks in the Prefect UI and API.

Regression: ``make run``'s one-API-per-run server (:func:`flows.prefect_server.shared_api`) was started with
``--no-services``. Prefect 3 clients report task runs as events and only the server's task-run recorder turns
them into task runs, so every stage's flow run said "This flow run did not generate any task or subflow runs"
(0 task runs through the API), while the same flow under the ephemeral API (``dvc exp run``) showed them.
Here a stage-like child process (``import flows``, a flow with submitted and called tasks, as the DVC stages
run them) runs under ``shared_api`` in a pristine environment, and its task runs are read back through the API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_PRODUCT_VARS = ("PREFECT_", "GX_", "MLFLOW_", "DO_NOT_TRACK", "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE")


def _pristine_env(tmp_path: Path) -> dict[str, str]:
    """A new user's shell: empty HOME and PREFECT_HOME, none of the product's or the tests' settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PRODUCT_VARS)}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PREFECT_HOME=str(home / ".prefect"), PYTHONPATH=str(REPO))
    return env


STAGE_CHILD = (
    "import flows\n"
    "from prefect import flow, task\n"
    "from prefect.task_runners import ThreadPoolTaskRunner\n"
    "@task\n"
    "def step(i: int) -> int:\n    return i * 2\n"
    "@flow(name='codea1-stage-probe', task_runner=ThreadPoolTaskRunner(max_workers=2))\n"
    "def stage() -> int:\n"
    "    futures = [step.submit(i) for i in range(3)]\n"
    "    return sum(f.result() for f in futures) + step(10)\n"
    "assert stage() == 26\n"
)

READ_BACK = (
    "import json, subprocess, sys, time, urllib.request\n"
    "import flows\n"
    "from flows.prefect_server import shared_api\n"
    "def post(url, body):\n"
    "    req = urllib.request.Request(url, data=json.dumps(body).encode(), method='POST',"
    " headers={'Content-Type': 'application/json'})\n"
    "    return json.load(urllib.request.urlopen(req))\n"
    "with shared_api() as url:\n"
    f"    out = subprocess.run([sys.executable, '-c', {STAGE_CHILD!r}], capture_output=True, text=True)\n"
    "    runs = post(url + '/flow_runs/filter', {})\n"
    "    deadline, tasks = time.monotonic() + 60, []\n"
    "    while time.monotonic() < deadline:  # the recorder writes the events it receives within seconds\n"
    "        tasks = post(url + '/task_runs/filter', {'flow_runs': {'id': {'any_': [r['id'] for r in runs]}}})\n"
    "        if len(tasks) >= 4 and all(t['state_type'] == 'COMPLETED' for t in tasks):\n"
    "            break\n"
    "        time.sleep(1)\n"
    "print(json.dumps({'rc': out.returncode, 'log': out.stdout + out.stderr, 'flow_runs': len(runs),"
    " 'tasks': [(t['name'], t['state_type']) for t in tasks]}))\n"
)


@pytest.mark.e2e  # a Prefect server and a stage-like flow in subprocesses
def test_a_stage_run_under_the_shared_api_records_its_task_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", READ_BACK],
        cwd=tmp_path,
        env=_pristine_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, result["log"][-3000:]
    assert result["flow_runs"] == 1
    names = sorted(name.rsplit("-", 1)[0] for name, _ in result["tasks"])
    assert names == ["step"] * 4, result["tasks"]
    assert {state for _, state in result["tasks"]} == {"COMPLETED"}, result["tasks"]
