"""Every stage of ``make run`` shows its steps as task runs in the Prefect UI, not only train and evaluate.

Before: the prepare, warmstart and register flow runs of a ``make run`` recorded 0 task runs (read from the
Prefect database of a finished run: prepare 0, warmstart 0, train 963, evaluate 4, register 0), so their pages said
"This flow run did not generate any task or subflow runs". Now their steps are tasks (``flows.common.stage_task``):
warmstart's ``build_base`` and ``sft[<role>]``, register's ``judge[<role>]``, prepare's ``validate_problems`` per
set. Here the real warm start runs on a tiny lab inside a flow under the session's Prefect API, and its task runs
are read back through the API; called outside a flow (tests, benches) the same functions run plainly.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import TINY_LAB

from codea1_core.config import Config

SMALLER_LAB = dict(
    TINY_LAB,
    train_per_family=2,
    warmstart_code_examples_per_problem=1,
    warmstart_test_examples_per_problem=1,
)


def _task_runs(flow_run_id, expected: int) -> list:
    """The flow run's task runs, read through the API (the server records them from events within seconds)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline, runs = time.monotonic() + 60, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            if len(runs) >= expected and all(
                r.state_type and r.state_type.value == "COMPLETED" for r in runs
            ):
                break
            time.sleep(0.5)
    return runs


@pytest.mark.e2e
def test_the_warm_start_records_its_steps_as_task_runs(prefect_harness, tmp_path: Path, monkeypatch) -> None:
    from prefect import flow
    from prefect.context import get_run_context

    from flows import warmstart

    monkeypatch.chdir(tmp_path)  # the stage writes outputs/warmstart/{code,test} under the working directory
    cfg = Config.from_dict({"lab": dict(SMALLER_LAB), "tracking": {"backend": "null"}})

    @flow(name="warmstart-probe")
    def probe() -> tuple:
        return get_run_context().flow_run.id, warmstart.warm_start(cfg)

    flow_run_id, metrics = probe()
    assert metrics["skipped"] is False and (tmp_path / "outputs" / "warmstart" / "code").is_dir()
    names = sorted(r.name for r in _task_runs(flow_run_id, 3))
    assert names[0].startswith("build_base") and names[1:] == ["sft[code]", "sft[test]"], names


def test_outside_a_flow_the_steps_run_as_plain_functions(tmp_path: Path) -> None:
    """No flow run, no Prefect API needed: benches and unit tests call the stage functions directly."""
    from flows.common import stage_task
    from tasks.register import judge

    calls = []

    def fake_task(*args):
        calls.append(args)
        return "done"

    class Task:  # what stage_task needs of a Prefect task outside a flow: its function
        fn = staticmethod(fake_task)

    assert stage_task(Task(), 1, [2]) == "done" and calls == [(1, [2])]
    assert callable(judge.fn) and judge.name == "judge"
