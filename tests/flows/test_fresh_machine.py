"""First contact: the entry points work on a machine that has never run Prefect.

Regression for the first ``make run`` on a fresh machine failing in its first stage ("Timed out while
attempting to connect to ephemeral Prefect API server" after 20 s): the 180 s start-up default was set after
``prefect`` had been imported, and Prefect reads its settings once, at import, so it kept 20 s — too short
for a first ephemeral server that creates and migrates its database on 2 cores. The tests' own conftest set
the variable before Prefect loaded, so only a subprocess with a pristine environment sees what users see.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# What the product sets (flows.environment) and what the test session sets: none may leak into the child.
_PRODUCT_VARS = ("PREFECT_", "GX_", "MLFLOW_", "DO_NOT_TRACK", "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE")


def _pristine_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a new user's shell: empty HOME and PREFECT_HOME, none of our defaults set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PRODUCT_VARS)}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PREFECT_HOME=str(home / ".prefect"), PYTHONPATH=str(REPO), **extra)
    return env


def _entry_modules() -> list[str]:
    """Every module a user or DVC starts: the DVC stages' ``python -m`` commands, the CLI, the make targets."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    modules = {re.search(r"python -m (\S+)", s["cmd"]).group(1) for s in stages.values()}
    makefile = (REPO / "Makefile").read_text()
    modules |= set(re.findall(r"python -m ((?:flows|tools)\.\w+)", makefile))
    modules |= {"flows.cli", "flows.serve", "tools.ui", "tools.lab_compare", "flows.solve", "flows.attack"}
    return sorted(modules)


def _settings_probe(modules: list[str]) -> str:
    imports = "; ".join(f"import {m}" for m in modules)
    return (
        f"{imports}; from prefect.settings import get_current_settings as s; "
        "print(s().server.ephemeral.startup_timeout_seconds, s().server.analytics_enabled)"
    )


@pytest.mark.e2e  # every entry point in a subprocess
@pytest.mark.timeout(900)  # one fresh interpreter per entry module
def test_every_entry_point_applies_the_prefect_defaults_before_prefect_reads_them(tmp_path: Path) -> None:
    """Each entry module, imported first in a pristine process, leaves Prefect with our start-up budget."""
    for module in _entry_modules():
        proc = subprocess.run(
            [sys.executable, "-c", _settings_probe([module])],
            cwd=tmp_path,
            env=_pristine_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, f"{module}: {proc.stderr[-2000:]}"
        budget, analytics = proc.stdout.split()
        assert float(budget) == 180 and analytics == "False", (
            f"{module}: Prefect settings seen {proc.stdout!r}"
        )


def test_an_explicit_user_setting_wins(tmp_path: Path) -> None:
    env = _pristine_env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="77")
    proc = subprocess.run(
        [sys.executable, "-c", _settings_probe(["flows.train"])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[0]) == 77


@pytest.mark.timeout(900)  # the stage subprocess may take 600 s
@pytest.mark.e2e
def test_first_stage_runs_on_a_fresh_machine(tmp_path: Path, shared_data_dir: Path) -> None:
    """``prepare`` as a subprocess with empty HOME and PREFECT_HOME: the first ephemeral API, first try.

    The stage is run exactly as DVC runs it (``python -m flows.prepare``); the wrapper only asserts, before
    handing over, that the process got the first-run start-up budget — a fast machine may start a first
    server within Prefect's 20 s, a user's 2-core laptop does not, so the budget is what must hold.
    """
    out = tmp_path / "prepared"
    wrapper = (
        "import runpy, sys; import flows.prepare; from prefect.settings import get_current_settings as s; "
        "budget = s().server.ephemeral.startup_timeout_seconds; "
        "assert budget >= 180, f'first-run start-up budget {budget} s'; "
        f"sys.argv = ['flows.prepare', '--params', {str(REPO / 'params.yaml')!r}, 'data.prepared_dir={out}']; "
        "runpy.run_module('flows.prepare', run_name='__main__')"
    )
    env = _pristine_env(tmp_path, CODEA1_DATA_DIR=str(shared_data_dir))
    proc = subprocess.run(
        [sys.executable, "-c", wrapper], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (out / "train.parquet").is_file() and (out / "report.json").is_file()
    assert (tmp_path / "home" / ".prefect").is_dir(), "the stage should have created its own Prefect home"


def _health(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


FLOW_CHILD = (
    "import flows; from prefect import flow\n"
    "@flow(name='codea1-probe')\n"
    "def probe():\n    return 1\n"
    "probe()\n"
)


@pytest.mark.timeout(900)  # the pipeline subprocess may take 400 s, after the stages it starts
@pytest.mark.e2e
def test_one_prefect_api_serves_every_stage_and_stops_after(tmp_path: Path) -> None:
    """Two stage-like processes under ``shared_api`` use its server (no temporary ones) and land in its DB."""
    code = (
        "import subprocess, sys, json, urllib.request\n"
        "import flows\n"
        "from flows.prefect_server import shared_api\n"
        "with shared_api() as url:\n"
        f"    outs = [subprocess.run([sys.executable, '-c', {FLOW_CHILD!r}], capture_output=True, text=True)"
        " for _ in range(2)]\n"
        "    req = urllib.request.Request(url + '/flow_runs/count', data=b'{}', method='POST',"
        " headers={'Content-Type': 'application/json'})\n"
        "    count = json.load(urllib.request.urlopen(req))\n"
        "print(json.dumps({'url': url, 'count': count, 'rc': [o.returncode for o in outs],"
        " 'logs': [o.stdout + o.stderr for o in outs]}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_pristine_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == [0, 0], result["logs"]
    assert result["count"] == 2
    assert not any("Starting temporary server" in log for log in result["logs"]), result["logs"]
    assert not _health(result["url"]), "the server must be stopped when the block ends"


def _start_holding_the_api(tmp_path: Path, body: str) -> tuple[subprocess.Popen, str]:
    """A process that holds ``shared_api()`` (running ``body`` inside it) and prints its URL first."""
    code = (
        "import time, flows\n"
        "from flows.prefect_server import shared_api, sigterm_as_interrupt\n"
        "try:\n"
        "    with sigterm_as_interrupt(), shared_api() as url:\n"
        "        print(url, flush=True)\n"
        f"        {body}\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', flush=True)\n"
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_pristine_env(tmp_path, TMPDIR=str(tmp_path / "tmp")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(proc.stderr.read()[-2000:])
    return proc, url


@pytest.mark.e2e
def test_sigterm_stops_the_pipeline_and_its_prefect_server(tmp_path: Path) -> None:
    proc, url = _start_holding_the_api(tmp_path, "time.sleep(600)")
    try:
        assert _health(url)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read().strip() == "stopped"
        assert time.monotonic() - t0 < 15
        assert not _health(url), "the Prefect server outlived the pipeline"
        assert not list((tmp_path / "tmp").glob("codea1-prefect-server-*.log"))  # its log went with it
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.e2e
def test_a_killed_pipeline_takes_its_prefect_server_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves no ``finally`` to run: the server must still not outlive the pipeline (no orphans)."""
    proc, url = _start_holding_the_api(tmp_path, "time.sleep(600)")
    try:
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _health(url) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _health(url), "the Prefect server outlived a killed pipeline"
        deadline = time.monotonic() + 15  # its guard removes the log once the server is stopped
        while list((tmp_path / "tmp").glob("codea1-prefect-server-*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list((tmp_path / "tmp").glob("codea1-prefect-server-*.log"))
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.e2e
def test_make_run_goes_through_the_pipeline_runner() -> None:
    """``make run`` starts one Prefect API for all stages (flows.pipeline), not one per DVC stage."""
    recipe = subprocess.run(
        ["make", "-n", "run", "VENV=/nonexistent", "STAMP=/dev/null"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert recipe.returncode == 0, recipe.stderr
    assert "-m flows.pipeline" in recipe.stdout
    assert "dvc repro" not in recipe.stdout.replace("flows.pipeline", "")
