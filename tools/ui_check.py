"""``python -m tools.ui_check``: what a user sees of a training run in the Prefect and MLflow UIs, checked in a
headless browser.

What it does: starts a Prefect server (with its UI) and the MLflow UI on free loopback ports, with their own
Prefect home and MLflow store in a temporary folder; builds a tiny random model and trains it for ``--steps``
steps (``python -m flows.train``) against both; then drives headless Chromium over its DevTools protocol through
the pages a user opens: the train flow run's page (its name, flow, state and iteration lines; its Task Runs tab:
each row named ``<task>[it=N]``, and the run-name search ``[it=1]`` narrowing it to that iteration) and the
MLflow run page the report links to (experiment, run name, metrics). It prints one PASS/FAIL line per item,
writes one screenshot per page to ``--out`` (default ``outputs/ui_check/``) and exits 0 when every item passes,
1 when one fails, 2 when it cannot check (no Chromium, a server or the training run that fails).

With ``--prefect-url`` and ``--mlflow-url`` (the servers of ``make ui``) it trains nothing: it checks the MLflow
run of ``--workspace``'s final export (``outputs/train/final/DONE.json``, written by ``make run``) and the latest
``train`` flow run that finished it.

What it does not: test the UIs' own features, or run without Chromium (``apt-get install chromium``, or
``chromium-headless-shell``; ``--chromium PATH`` names another binary). The selectors (``.task-run-list-item``,
``.flow-run-task-runs__search``, ...) are those of Prefect 3's UI: a UI that renames them fails here, by name,
rather than passing.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.ui import answers, commands, prefect_env, stop

BROWSERS = (
    "chromium",
    "chromium-headless-shell",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)
"""Binary names looked up on ``PATH`` (Debian's ``chromium`` and ``chromium-headless-shell`` first)."""
WINDOW = (1600, 1000)
NAME = re.compile(r"^(?P<task>\w+)\[it=(?P<it>\d+)\]$")
"""A train step's task run name, ``rollout_code[it=3]`` (``task_run_name`` of each task in ``tasks/``)."""
SERVER_START_S = 600.0
"""How long the two servers may take to answer: MLflow's first start migrates its new store (a minute or more
on a small, busy machine)."""
SHOTS = ("prefect_flow_run.png", "prefect_task_runs.png", "prefect_task_runs_it1.png", "mlflow_run.png")
"""The screenshots, one per page state, in the order they are taken (a run removes the last run's first)."""
FIRST_AND_LAST = ("rollout_code", "checkpoint")
"""Steps every iteration runs whatever the mode: the list searched for one iteration must show both."""


class CannotCheck(Exception):
    """No browser, a server that does not start, a run that is not there: exit 2 with this message."""


@dataclass(frozen=True)
class Check:
    """One item a user must see: passed or not, and what was seen."""

    item: str
    ok: bool
    detail: str


# ------------------------------------------------------------------------------------------------
# Decisions: pure functions of what the pages showed
# ------------------------------------------------------------------------------------------------
def iteration_lines(steps: int) -> list[str]:
    """The console lines a run logs that the page must show: the first and the last iteration's."""
    return [f"it {i}/{steps}" for i in sorted({1, steps})]


def shows_line(text: str, line: str) -> bool:
    """Whether ``text`` has ``line`` (``it 1/2``) as whole words (not ``it 1/20``)."""
    return re.search(rf"(?<!\S){re.escape(line)}(?!\S)", text) is not None


def check_flow_run_page(
    heading: dict[str, str], body: str, run_name: str, steps: int, in_api: bool = True
) -> list[Check]:
    """The flow run page: its heading (``crumbs``, ``flow``, ``state``) names the run, the flow ``train`` and
    the state ``Completed``; the Logs tab shows the first and last iteration's line (``it 1/2  code_r ...``).
    ``in_api``: whether the API had those lines (a failure then is the page's, not the run's)."""
    want = {"crumbs": run_name, "flow": "train", "state": "Completed"}
    wrong = {k: heading.get(k, "") for k, v in want.items() if v not in heading.get(k, "").split()}
    lines = iteration_lines(steps)
    shown = [line for line in lines if shows_line(body, line)]
    where = "" if shown == lines else "; the API has them" if in_api else "; not in the API's logs either"
    return [
        Check(
            "prefect: flow run page",
            not wrong,
            f"{heading.get('crumbs', '')} | {heading.get('flow', '')} | {heading.get('state', '')}"
            + (f"; expected {want}" if wrong else ""),
        ),
        Check("prefect: iteration lines in the logs", shown == lines, f"shows {shown} of {lines}{where}"),
    ]


def check_task_runs(rows: list[dict[str, Any]], total: int | None) -> list[Check]:
    """The Task Runs tab: every listed row is named ``<task>[it=N]`` (its iteration, searchable)."""
    names = [str(r["name"]) for r in rows]
    unnamed = [n for n in names if not NAME.match(n)]
    of = f" of {total}" if total is not None else ""
    return [
        Check(
            "prefect: task runs named <task>[it=N]",
            bool(rows) and not unnamed,
            f"{len(rows)} rows listed{of}" + (f"; not <task>[it=N]: {unnamed[:3]}" if unnamed else "")
            if rows
            else "no task run listed",
        )
    ]


def iteration_search(iteration: int) -> str:
    """What a user types into the Task Runs tab's "Search by run name" to see one iteration: ``[it=1]``
    (the brackets keep ``[it=1]`` from matching ``[it=10]``)."""
    return f"[it={iteration}]"


def check_filtered(names: list[str], iteration: int) -> Check:
    """With the run-name search at ``[it=<iteration>]``: only that iteration's task runs, its first and last
    step among them."""
    search = iteration_search(iteration)
    others = [n for n in names if not n.endswith(search)]
    missing = [f"{t}{search}" for t in FIRST_AND_LAST if f"{t}{search}" not in names]
    ok = bool(names) and not others and not missing
    detail = f"{len(names)} rows" + (f"; other iterations: {others[:3]}" if others else "")
    detail += f"; missing {missing}" if missing else ""
    return Check(f"prefect: search {search} lists that iteration", ok, detail)


def check_mlflow_page(body: str, experiment: str, run_name: str, metrics: tuple[str, ...]) -> list[Check]:
    """The MLflow run page: experiment and run name on the page, and the rewards among its metrics."""
    named = [w for w in (experiment, run_name) if w in body]
    shown = [m for m in metrics if m in body]
    return [
        Check(
            "mlflow: run page names experiment and run",
            len(named) == 2,
            f"shows {named or 'none'} of [{experiment!r}, {run_name!r}]",
        ),
        Check(
            "mlflow: rewards among the metrics", shown == list(metrics), f"shows {shown} of {list(metrics)}"
        ),
    ]


def task_run_total(text: str) -> int | None:
    """``"20 Task runs (20 completed)"`` -> 20 (the Task Runs tab's count); None when absent."""
    m = re.search(r"(\d+)\s+Task runs?\b", text)
    return int(m.group(1)) if m else None


def report(checks: list[Check]) -> str:
    """One line per item (``PASS``/``FAIL``, the item, what was seen) and a closing count."""
    width = max(len(c.item) for c in checks)
    lines = [f"{'PASS' if c.ok else 'FAIL'}  {c.item:<{width}}  {c.detail}" for c in checks]
    passed = sum(c.ok for c in checks)
    return "\n".join([*lines, f"{passed} of {len(checks)} items pass"])


def find_chromium(explicit: str | None = None) -> str | None:
    """``explicit`` when given and executable, else the first of :data:`BROWSERS` on ``PATH``."""
    if explicit:
        return shutil.which(explicit)
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


# ------------------------------------------------------------------------------------------------
# Headless Chromium over the DevTools protocol
# ------------------------------------------------------------------------------------------------
class Page:
    """One headless Chromium tab driven over its DevTools websocket (``Runtime.evaluate``, screenshots)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events (no id) are not asked for; skip any that arrive
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise CannotCheck(f"Chromium refused {method}: {msg['error'].get('message')}")
                return dict(msg["result"])

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait(self, expression: str, timeout_s: float, settle_s: float = 1.0) -> Any:
        """Poll ``expression`` until it is truthy and the same ``settle_s`` apart (a JS app still loading
        changes it); returns the last value (falsy after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value and value == last:
                return value
            last = value
            time.sleep(settle_s)
        return last

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def chromium(binary: str, workdir: Path, timeout_s: float = 60.0) -> Iterator[Page]:
    """A headless Chromium with its own profile under ``workdir``; yields its first tab."""
    from websockets.sync.client import connect

    profile = workdir / "chromium-profile"
    cmd = [binary, "--headless", "--disable-gpu", "--remote-debugging-port=0", f"--user-data-dir={profile}"]
    cmd += [f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars", "about:blank"]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to start as root with its own sandbox
    log = (workdir / "chromium.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CannotCheck(f"{binary} did not start (its log: {workdir / 'chromium.log'})")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
        target = next(t for t in targets if t.get("type") == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, proxy=None) as ws:
            yield Page(ws)
    finally:  # the whole group: renderers left running would still write into the profile
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


# ------------------------------------------------------------------------------------------------
# The servers' APIs: which flow run and MLflow run to look at
# ------------------------------------------------------------------------------------------------
def _get(url: str, body: dict[str, Any] | None = None) -> str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(req, timeout=30) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError) as exc:
        raise CannotCheck(f"{url}: {exc}") from exc


def mlflow_run(mlflow_url: str, run_id: str) -> dict[str, Any]:
    """``{"experiment_id", "experiment", "run_name", "steps", "end_ms"}`` of an MLflow run, from the server's REST
    API (``steps``: the run's last ``iteration`` metric; ``end_ms``: when it ended, None while it runs)."""
    run = json.loads(_get(f"{mlflow_url}/api/2.0/mlflow/runs/get?run_id={run_id}"))["run"]
    exp_id = run["info"]["experiment_id"]
    exp = json.loads(_get(f"{mlflow_url}/api/2.0/mlflow/experiments/get?experiment_id={exp_id}"))
    metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
    return {
        "experiment_id": exp_id,
        "experiment": exp["experiment"]["name"],
        "run_name": run["info"]["run_name"],
        "steps": int(metrics.get("iteration", 0)),
        "end_ms": run["info"].get("end_time"),
    }


def flow_run_filter(end_ms: int | None) -> dict[str, Any]:
    """The Prefect API filter for the ``train`` flow run that finished an MLflow run ending at ``end_ms``: the
    latest one started before that end (a resumed run: the flow run that resumed and finished it).

    Not by name: a flow run's name carries its overrides (``flows.common.flow_run_name``), an MLflow run's
    name under ``dvc exp run`` the experiment's name, so neither need equal the other."""
    body: dict[str, Any] = {"flows": {"name": {"any_": ["train"]}}, "sort": "START_TIME_DESC", "limit": 1}
    if end_ms is not None:
        end = datetime.datetime.fromtimestamp(int(end_ms) / 1000, tz=datetime.UTC)
        body["flow_runs"] = {"start_time": {"before_": end.isoformat()}}
    return body


def finishing_flow_run(prefect_url: str, end_ms: int | None) -> tuple[str, str]:
    """``(id, name)`` of the train flow run :func:`flow_run_filter` selects."""
    runs = json.loads(_get(f"{prefect_url}/api/flow_runs/filter", flow_run_filter(end_ms)))
    if not runs:
        raise CannotCheck(f"no train flow run on {prefect_url} started before the MLflow run ended")
    return str(runs[0]["id"]), str(runs[0]["name"])


def wait_for_logs(prefect_url: str, flow_run_id: str, lines: list[str], timeout_s: float) -> bool:
    """Poll the API's logs of a flow run until each of ``lines`` is there (its text search, one line at a time:
    a long run logs thousands); whether they all came."""
    deadline = time.monotonic() + timeout_s
    missing = list(lines)
    while missing:
        line = missing[0]
        body = {
            "logs": {"flow_run_id": {"any_": [flow_run_id]}, "text": {"query": json.dumps(line)}},
            "limit": 20,
        }
        logs = json.loads(_get(f"{prefect_url}/api/logs/filter", body))
        if any(shows_line(str(log.get("message", "")), line) for log in logs):
            missing.pop(0)
        elif time.monotonic() > deadline:
            return False
        else:
            time.sleep(2)
    return True


def workspace_run_id(workspace: Path) -> str:
    """The MLflow run id of the workspace's final export: the config ``final/DONE.json`` names, looked up in the
    folder's record of runs (``tracking.results.recorded_run_id``)."""
    from tracking.results import RUNS_FILE, recorded_run_id

    done = workspace / "final" / "DONE.json"
    try:
        fingerprint = str(json.loads(done.read_text())["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CannotCheck(f"{done}: no finished training run there ({exc}); run `make run` first") from exc
    run_id = recorded_run_id(workspace, fingerprint)
    if run_id is None:
        raise CannotCheck(
            f"{workspace / RUNS_FILE}: no MLflow run recorded for {done}'s config; run `make run` first"
        )
    return run_id


# ------------------------------------------------------------------------------------------------
# The pages
# ------------------------------------------------------------------------------------------------
ROWS_JS = """Array.from(document.querySelectorAll('.task-run-list-item')).map(e => ({
  name: (e.querySelector('.state-list-item__name') || {innerText: ''}).innerText.trim()}))"""
"""The Task Runs tab's rows, by name."""
HEADING_JS = """(() => {
  const t = s => (document.querySelector(s) || {innerText: ''}).innerText.replace(/\\s+/g, ' ').trim();
  return {crumbs: t('.page-heading-flow-run .p-bread-crumbs__crumb:last-child'), flow: t('.flow-run-flow'),
          state: t('.page-heading-flow-run .state-badge')}; })()"""
"""The flow run page's heading: the run's name (last crumb), ``Flow train``, the state badge."""
SEARCH_JS = """(() => {{ const i = document.querySelector('.flow-run-task-runs__search input');
  if (!i) return false;
  const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
  set.call(i, {text}); i.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()"""
"""Type into the Task Runs tab's "Search by run name" box (the UI listens to its ``input`` event)."""


def prefect_pages(
    page: Page, prefect_url: str, flow_run_id: str, run_name: str, steps: int, out: Path, timeout_s: float
) -> list[Check]:
    """The train flow run's page, its Task Runs tab, the run-name search at ``[it=1]``; a screenshot of each."""
    # the client sends its logs in batches: wait until the API has them, so the page that loads them once does
    in_api = wait_for_logs(prefect_url, flow_run_id, iteration_lines(steps), timeout_s)
    page.open(f"{prefect_url}/runs/flow-run/{flow_run_id}")
    # the Task Runs tab appears once the run's state has loaded; the Logs tab is open first
    last_line = json.dumps(iteration_lines(steps)[-1])
    page.wait(
        f"!!document.getElementById('task-runs') && document.body.innerText.includes({last_line})", timeout_s
    )
    body = page.js("document.body.innerText") or ""
    checks = check_flow_run_page(page.js(HEADING_JS) or {}, body, run_name, steps, in_api)
    page.screenshot(out / "prefect_flow_run.png")
    page.js("document.getElementById('task-runs') && document.getElementById('task-runs').click()")
    rows = page.wait(ROWS_JS, timeout_s) or []
    checks += check_task_runs(rows, task_run_total(page.js("document.body.innerText") or ""))
    page.js("document.getElementById('task-runs') && document.getElementById('task-runs').scrollIntoView()")
    page.screenshot(out / "prefect_task_runs.png")
    search = iteration_search(1)
    if page.js(SEARCH_JS.format(text=json.dumps(search))):
        only_it1 = (
            f"(rows => rows.length > 0 && rows.every(r => r.name.endsWith({json.dumps(search)})) && rows)"
        )
        filtered = page.wait(f"{only_it1}({ROWS_JS})", timeout_s) or page.js(ROWS_JS) or []
        checks.append(check_filtered([str(r["name"]) for r in filtered], 1))
        page.screenshot(out / "prefect_task_runs_it1.png")
    else:
        checks.append(
            Check(f"prefect: search {search} lists that iteration", False, "no run-name search box")
        )
    return checks


def mlflow_page(
    page: Page, mlflow_url: str, run_id: str, run: dict[str, Any], out: Path, timeout_s: float
) -> list[Check]:
    """The MLflow run page the report links to (the runs view, ``tracking.results.MLFLOW_UI_VIEW``)."""
    from tracking.results import MLFLOW_UI_VIEW

    page.open(f"{mlflow_url}/#/experiments/{run['experiment_id']}/runs/{run_id}{MLFLOW_UI_VIEW}")
    name = json.dumps(run["run_name"])
    body = page.wait(
        f"document.body.innerText.includes({name}) && document.body.innerText.includes('Metrics (')"
        " && document.body.innerText",
        timeout_s,
    )
    body = body or page.js("document.body.innerText") or ""
    page.screenshot(out / "mlflow_run.png")
    return check_mlflow_page(
        body, run["experiment"], run["run_name"], ("code/reward_mean", "test/reward_mean")
    )


# ------------------------------------------------------------------------------------------------
# A temporary Prefect server, MLflow UI and training run
# ------------------------------------------------------------------------------------------------
def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def servers(workdir: Path, timeout_s: float) -> Iterator[tuple[str, str, str]]:
    """A Prefect server with its UI and the MLflow UI on free ports, their state under ``workdir``; yields
    ``(prefect_url, mlflow_url, tracking_uri)`` once both answer, stops both on leaving. A server whose port was
    taken between the pick and its bind is started again on other ports."""
    from flows.prefect_server import START_ATTEMPTS

    for attempt in range(1, START_ATTEMPTS + 1):
        procs: dict[str, subprocess.Popen] = {}
        try:
            urls = _start_servers(workdir, timeout_s, procs)
        except PortTaken:
            stop(list(procs.values()))
            if attempt == START_ATTEMPTS:
                raise
            continue
        except BaseException:
            stop(list(procs.values()))
            raise
        try:
            yield urls
        finally:
            stop(list(procs.values()))
        return


class PortTaken(CannotCheck):
    """A server exited because another process bound its port first."""


def _start_servers(
    workdir: Path, timeout_s: float, procs: dict[str, subprocess.Popen]
) -> tuple[str, str, str]:
    """Start both servers into ``procs`` and wait until both answer; returns their URLs and the tracking URI."""
    from flows.prefect_server import SERVICES_ENV, free_port, port_taken

    pp, mp = free_port(), free_port()
    while mp == pp:
        mp = free_port()
    tracking_uri = f"sqlite:///{workdir / 'mlflow.db'}"
    prefect_cmd, mlflow_cmd = commands(pp, mp, tracking_uri, str(workdir / "artifacts"))
    home = {"PREFECT_HOME": str(workdir / "prefect-home")}
    envs = {"Prefect": {**prefect_env(pp), **SERVICES_ENV, **home}, "MLflow": {**os.environ, **home}}
    health = {"Prefect": f"http://127.0.0.1:{pp}/api/health", "MLflow": f"http://127.0.0.1:{mp}/health"}
    for name, cmd in zip(envs, (prefect_cmd, mlflow_cmd), strict=True):
        with (workdir / f"{name}.log").open("wb") as log:
            procs[name] = subprocess.Popen(
                cmd, env=envs[name], stdout=log, stderr=log, start_new_session=True
            )
    deadline = time.monotonic() + timeout_s
    while waiting := [name for name in procs if not answers(health[name])]:
        for name in waiting:
            code = procs[name].poll()
            if code is not None or time.monotonic() > deadline:
                why = f"exited with code {code}" if code is not None else f"no answer in {timeout_s:.0f} s"
                log_path = workdir / f"{name}.log"
                error = PortTaken if code is not None and port_taken(log_path) else CannotCheck
                raise error(f"the {name} server {why}; the end of its log:\n{_tail(log_path)}")
        time.sleep(1)
    return f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{mp}", tracking_uri


def train_tiny(workdir: Path, prefect_url: str, tracking_uri: str, steps: int) -> str:
    """Build a tiny random model, train it ``steps`` steps on the lab against the given servers; returns the
    MLflow run id."""
    import yaml

    from codea1_core.config import Config
    from codea1_core.data.warmstart_data import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model

    corpus = tokenizer_corpus(Config().lab, k=8)[:300]
    model = build_tiny_model(
        workdir / "model",
        corpus,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        vocab_size=512,
    )
    cfg = Config().replace(
        **{
            "data.train_batch_size": 2,
            "data.prepared_dir": str(workdir / "no_prepared"),  # the lab, generated in memory
            "model.code_path": str(model),
            "model.test_path": str(model),
            "model.lora_rank": 4,
            "model.lora_alpha": 8,
            "rollout.n_code": 2,
            "rollout.n_tests": 2,
            "rollout.max_new_tokens_code": 16,
            "rollout.max_new_tokens_test": 16,
            "grpo.mini_batches": 1,
            "grpo.warmup_steps": 1,
            "eval.every": 0,
            "tracking.tracking_uri": tracking_uri,
            "tracking.artifact_location": str(workdir / "artifacts"),
            "tracking.log_samples": 4,
            "orchestration.max_steps": steps,
            "orchestration.checkpoint_dir": str(workdir / "train"),
            "lab.train_per_family": 1,
            "lab.heldout_per_family": 1,
        }
    )
    params = workdir / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    env = {
        k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"
    }  # (it would win over the params)
    env |= {"PREFECT_API_URL": f"{prefect_url}/api", "PREFECT_HOME": str(workdir / "prefect-home")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    log = workdir / "train.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "flows.train", "--params", str(params)],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        raise CannotCheck(
            f"the training run failed (exit {done.returncode}); the end of its log:\n{_tail(log)}"
        )
    return workspace_run_id(workdir / "train")


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------
def check_run(
    page: Page, prefect_url: str, mlflow_url: str, run_id: str, out: Path, timeout_s: float
) -> list[Check]:
    """Every item, for the MLflow run ``run_id`` and the train flow run that finished it."""
    run = mlflow_run(mlflow_url, run_id)
    flow_run_id, flow_run_name = finishing_flow_run(prefect_url, run["end_ms"])
    checks = prefect_pages(page, prefect_url, flow_run_id, flow_run_name, run["steps"], out, timeout_s)
    return checks + mlflow_page(page, mlflow_url, run_id, run, out, timeout_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.ui_check [--out DIR] [--steps N] [--prefect-url URL --mlflow-url URL]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.ui_check",
        description="Train a tiny model 2 steps and check its Prefect and MLflow UI pages in headless Chromium.",
    )
    parser.add_argument(
        "--out", default="outputs/ui_check", help="screenshots folder (default outputs/ui_check)"
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps of the tiny run (default 2)")
    parser.add_argument(
        "--prefect-url", help="a running Prefect UI (make ui: http://127.0.0.1:4200): no training"
    )
    parser.add_argument(
        "--mlflow-url", help="a running MLflow UI (make ui: http://127.0.0.1:5000): no training"
    )
    parser.add_argument(
        "--workspace", default="outputs/train", help="with the URLs: whose final run to check"
    )
    parser.add_argument("--chromium", help="the browser binary (default: chromium on PATH)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per page (default 120)")
    args = parser.parse_args(argv)
    if bool(args.prefect_url) != bool(args.mlflow_url):
        parser.error("--prefect-url and --mlflow-url go together (or neither: a temporary pair)")
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    out = Path(args.out)
    try:
        binary = find_chromium(args.chromium)
        if binary is None:
            raise CannotCheck(
                f"no Chromium ({args.chromium or ', '.join(BROWSERS)}) on PATH: `apt-get install chromium` or "
                "pass --chromium PATH"
            )
        out.mkdir(parents=True, exist_ok=True)
        for name in SHOTS:
            (out / name).unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="codea1-ui-check-", ignore_cleanup_errors=True) as tmp:
            workdir = Path(tmp)
            with contextlib.ExitStack() as stack:
                if args.prefect_url:
                    prefect_url, mlflow_url = args.prefect_url.rstrip("/"), args.mlflow_url.rstrip("/")
                    run_id = workspace_run_id(Path(args.workspace))
                else:
                    print("starting a Prefect server and the MLflow UI on free ports", flush=True)
                    prefect_url, mlflow_url, uri = stack.enter_context(servers(workdir, SERVER_START_S))
                    print(f"training a tiny model {args.steps} steps against {prefect_url}", flush=True)
                    run_id = train_tiny(workdir, prefect_url, uri, args.steps)
                page = stack.enter_context(chromium(binary, workdir))
                checks = check_run(page, prefect_url, mlflow_url, run_id, out, args.timeout_s)
    except CannotCheck as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: servers and browser stopped", file=sys.stderr)
        return 130
    print(report(checks))
    print(f"screenshots: {', '.join(str(out / n) for n in SHOTS if (out / n).exists())}")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
