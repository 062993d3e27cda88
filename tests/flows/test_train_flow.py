"""The train flow: pure loop helpers, and smoke runs of every mode with a real tiny model and sandbox."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import build_tiny, log_lines, tiny_config, write_params

from codea1_core.config import Config
from codea1_core.method import batches
from tracking.results import training_run_id

# ------------------------------------------------------------------------------------------------
# Pure helpers (codea1_core/method/batches.py)
# ------------------------------------------------------------------------------------------------


def test_sampler_epochs_drop_last_and_depend_only_on_step() -> None:
    n, b = 10, 3
    assert batches.steps_per_epoch(n, b) == 3 and batches.total_steps(n, b, 3) == 9
    assert batches.total_steps(n, b, 3, max_steps=4) == 4
    epoch0 = [i for s in range(3) for i in batches.batch_indices(n, b, 1, s)]
    epoch1 = [i for s in range(3, 6) for i in batches.batch_indices(n, b, 1, s)]
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9  # one problem dropped per epoch
    assert epoch0 != epoch1  # reshuffled each epoch
    assert batches.batch_indices(n, b, 1, 4) == batches.batch_indices(n, b, 1, 4)
    assert batches.batch_indices(n, b, 2, 0) != batches.batch_indices(n, b, 1, 0)
    with pytest.raises(ValueError, match="no full batch"):
        batches.batch_indices(2, 3, 1, 0)


def test_iteration_seed_and_fingerprint() -> None:
    assert batches.iteration_seed(1, 3, "code") == batches.iteration_seed(1, 3, "code")
    assert len({batches.iteration_seed(1, i, r) for i in range(5) for r in ("code", "test")}) == 10
    base = Config().flat()
    fp = batches.config_fingerprint(base)
    assert (
        batches.config_fingerprint(dict(base, **{"orchestration.max_steps": 7, "sandbox.workers": 9})) == fp
    )
    assert batches.config_fingerprint(dict(base, **{"reward.alpha": 0.25})) != fp


def test_starting_book_per_mode_and_resume() -> None:
    """§8: no book in golden mode or when disabled; the checkpoint's on resume; else an empty one."""
    from codea1_core.method.mistake_book import MistakeBook, starting_book
    from codea1_core.types import TestCase

    cfg = Config()
    assert starting_book(cfg.replace(mode="golden"), None) is None
    assert starting_book(cfg.replace(**{"mistake_book.enabled": False}), None) is None
    fresh = starting_book(cfg, None)
    assert isinstance(fresh, MistakeBook) and fresh.size() == 0
    fresh.update("p", [TestCase("f(1)", 2)], [], 1)
    again = starting_book(cfg, fresh.to_dict())
    assert again.to_dict() == fresh.to_dict() and again.size() == 1


@dataclass
class _Comp:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str = ""


@dataclass
class _Scores:
    code_rewards: list[float]
    test_rewards: list[list[float]]
    code_mask: list[bool]
    test_mask: list[list[bool]]


def test_group_batches_mask_and_topvar() -> None:
    grpo = Config().grpo
    comps = [[_Comp([1], [10 + m]) for m in range(3)]]
    tests = [[[_Comp([2], [20 + 3 * m + n]) for n in range(3)] for m in range(3)]]
    scores = [
        _Scores(
            [1.0, 0.0, 0.5],
            [[0.1, 0.1, 0.1], [0.0, 1.0, 0.5], [0.2, 0.3, 0.2]],
            [True, True, False],
            [[True] * 3, [True] * 3, [False] * 3],
        )
    ]
    code = batches.build_group_batch(batches.code_groups(comps, scores), grpo)
    assert code.completion_ids == [[10], [11]]  # the infra-masked code is left out (D4)
    assert code.advantages[0] > 0 > code.advantages[1]
    groups, picked = batches.test_groups(tests, scores, update_n=1)
    assert picked == [[1]]  # the code whose suites spread most (§9)
    test = batches.build_group_batch(groups, grpo)
    assert test.completion_ids == [[23], [24], [25]] and test.zero_variance_groups == 0
    both = code.concat(test)
    assert len(both) == 5 and both.groups == 2
    flat = batches.build_group_batch([(comps[0], [0.5, 0.5, 0.5], [True] * 3)], grpo)
    assert flat.zero_variance_groups == 1 and flat.advantages == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------------
# Tasks (.fn with small fakes for what the task receives)
# ------------------------------------------------------------------------------------------------


def _lab_problem():
    from codea1_core.data.lab import lab_problems

    return lab_problems(Config().lab, "train")[0]


def test_gate_task_drops_rejected_tests_and_counts_them_invalid() -> None:
    from tasks.rollout import gate_tests

    p = _lab_problem()
    ep = p.entry_point
    text = f"```python\nassert {ep}(1) == 2\nassert {ep}(().__class__) == 1\nassert {ep}(1) == 3\n```"
    suites, metrics = gate_tests.fn([p], [[[_Comp([], [], text)]]], Config(), 1)
    suite = suites[0][0][0]
    assert [t.call for t in suite.tests] == [
        f"{ep}(1)"
    ]  # the parser refuses the dunder, the GX gate the duplicate
    assert suite.invalid == 2 and sorted(suite.reasons) == ["dunder", "gate_duplicate"]
    assert metrics["test/rejected_rate"] == pytest.approx(1 / 2) and metrics["test/gate_rows"] == 2


class _FlakyExecutor:
    """Returns infra errors for the first ``bad_rounds`` calls of run_many (a broken worker pool)."""

    def __init__(self, bad_rounds: int) -> None:
        self.bad_rounds, self.calls = bad_rounds, 0

    def run_many(self, jobs):
        from codea1_core.types import CallOutcome

        self.calls += 1
        status = "infra_error" if self.calls <= self.bad_rounds else "ok"
        return [[CallOutcome(status, 1 if status == "ok" else None) for _ in exprs] for _, exprs in jobs]


def test_execute_retries_infra_errors_then_aborts() -> None:
    from tasks.execute import InfraFailure, run_jobs

    jobs = [("def f(): pass", ["f()", "1"]), ("x = 1", ["x"])]
    ex = _FlakyExecutor(bad_rounds=1)
    out = run_jobs(ex, jobs, 0.1, "it 1")
    assert ex.calls == 2 and all(o.status == "ok" for row in out for o in row)
    with pytest.raises(InfraFailure, match="3/3 calls hit sandbox infrastructure errors"):
        run_jobs(_FlakyExecutor(bad_rounds=2), jobs, 0.1, "it 1")


def test_merge_mistake_book_task_updates_and_persists(tmp_path: Path) -> None:
    from codea1_core.method.mistake_book import MistakeBook
    from codea1_core.types import TestCase
    from tasks.mistake_book import merge_mistake_book, retrieve_replay

    @dataclass
    class _Matrix:  # the two lists the update needs (§8), as OutcomeMatrix exposes them
        problem_id: str
        failed: list
        passed: list
        replay_passed: tuple = ((True, False),)
        problem_infra: bool = False

        def failed_tests(self):
            return self.failed

        def passed_replay(self):
            return self.passed

    book = MistakeBook.from_config(Config().mistake_book)
    t1, t2 = TestCase("f(1)", 2), TestCase("f(2)", 3)
    metrics = merge_mistake_book.fn(book, [_Matrix("p", [t1, t1, t2], [])], 1, tmp_path / "mb.json")
    assert metrics["mistake_book/size"] == 2 and metrics["mistake_book/added"] == 2
    assert metrics["mistake_book/replay_pass_rate"] == 0.5
    assert (tmp_path / "mb.json").is_file()
    nothing = merge_mistake_book.fn(book, [_Matrix("q", [], [], replay_passed=())], 2, None)
    assert math.isnan(nothing["mistake_book/replay_pass_rate"])  # nothing replayed is no rate, not 0
    (p,) = [type("P", (), {"id": "p"})()]
    assert retrieve_replay(book, [p], Config())[0][0] == t1  # frequency 2 first
    assert retrieve_replay(book, [p], Config().replace(**{"mistake_book.enabled": False})) == [[]]
    masked = merge_mistake_book.fn(book, [_Matrix("p", [t2], [], problem_infra=True)], 2)
    assert masked["mistake_book/size"] == 2 and "mistake_book/incremented" not in masked  # D4: not scored


# ------------------------------------------------------------------------------------------------
# Flow smoke runs (real tiny model, real sandbox, Prefect harness, MLflow sqlite)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _task_run_tags(flow_run_id: object) -> dict[str, list[str]]:
    """The flow run's task runs: name -> tags."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name: sorted(r.tags) for r in runs}


def _task_run_names(flow_run_id: object) -> set[str]:
    return set(_task_run_tags(flow_run_id))


def _flow_run_name(flow_run_id: object) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).name


def _mlflow(cfg: Config):
    from mlflow.tracking import MlflowClient

    uri = cfg.tracking.tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.mark.e2e
def test_codea1_flow_end_to_end(
    prefect_harness: None, tiny_model: Path, tmp_path: Path, monkeypatch, caplog
) -> None:
    from codea1_core.method.mistake_book import MistakeBook
    from flows.train import train_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    serialised: list[int] = []
    to_dict = MistakeBook.to_dict
    monkeypatch.setattr(MistakeBook, "to_dict", lambda book: serialised.append(1) or to_dict(book))
    cfg = tiny_config(tmp_path, tiny_model)
    params = write_params(cfg, tmp_path / "params.yaml")
    with (
        caplog.at_level(logging.INFO, logger="codea1.train"),
        log_lines("codea1.train", fmt="%(message)s") as lines,
    ):
        state = train_flow(params, return_state=True)
    assert state.is_completed(), state
    # a fresh run says it starts (not "resuming after iteration 0")
    assert any(line.endswith("2 steps, starting at iteration 1") for line in lines), lines
    assert len(serialised) == 2 + 1  # once per step (the checkpoint copies the merge's file), once at the end
    assert _flow_run_name(state.state_details.flow_run_id) == "train-codea1-seed1-alpha0.5"
    runs = _task_run_tags(state.state_details.flow_run_id)
    names = set(runs)
    for it in (1, 2):
        for task in (
            "rollout_code",
            "rollout_tests",
            "gate_tests",
            "execute",
            "score",
            "merge_mistake_book",
            "update_code",
            "update_test",
            "checkpoint",
            "log_iteration",
        ):
            assert f"{task}[it={it}]" in names, (task, it, sorted(names))
            # untagged: a tagged task run makes Prefect look up the tags' concurrency limits on the server (a
            # write that waits out the client's back-off when SQLite is busy); the UI searches the name's "[it=N]"
            assert runs[f"{task}[it={it}]"] == [], (task, runs[f"{task}[it={it}]"])
    out = tmp_path / "train"
    assert (out / "checkpoints" / "LATEST").read_text() == "it_000002"
    assert sorted(p.name for p in (out / "checkpoints" / "it_000002").iterdir()) == [
        "MANIFEST.json",
        "code",
        "mistake_book.json",
        "rng.pt",
        "state.json",
        "test",
    ]
    book = (out / "checkpoints" / "it_000002" / "mistake_book.json").read_bytes()
    assert book == (out / "mistake_book.json").read_bytes()  # the DVC out and the checkpoint: the same bytes
    assert (out / "final" / "code" / "config.json").is_file() and (
        out / "outcomes" / "it_000002.parquet"
    ).is_file()
    from codea1_core.evaluation.comparison import parse_history

    assert [r["iteration"] for r in parse_history((out / "history.csv").read_text())] == [1, 2]
    assert (
        json.loads((out / "metrics.json").read_text())["iteration"] == 2
        and not (out / "metrics.jsonl").exists()
    )
    done = json.loads((out / "final" / "DONE.json").read_text())
    client = _mlflow(cfg)
    run = client.get_run(training_run_id(cfg))
    for key in (
        "code/reward_mean",
        "test/reward_mean",
        "mistake_book/size",
        "sandbox/calls",
        "time/execute_s",
        "grpo/code/loss",
        "grpo/test/loss",
    ):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    assert run.data.params["mode"] == "codea1" and run.info.status == "FINISHED"
    assert client.get_model_version("codea1-code", done["versions"]["code"]).run_id == run.info.run_id
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"samples", "outcomes", "mistake_book"}

    # a second run of the same config resumes, finds nothing to do, and logs nothing twice
    again = train_flow(params)
    assert again["iteration"] == 2
    assert [m.step for m in client.get_metric_history(run.info.run_id, "code/reward_mean")] == [1, 2]
    assert len(client.search_model_versions("name='codea1-code'")) == 1


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("mode", "extra", "roles"),
    [
        ("golden", {}, ["code"]),
        ("selfplay", {}, ["code"]),
        ("codea1", {"mistake_book.enabled": False, "reward.alpha": 0.25}, ["code", "test"]),
    ],
)
def test_modes_and_ablations(prefect_harness, tiny_model, tmp_path, monkeypatch, mode, extra, roles) -> None:
    from flows.train import train_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config(tmp_path, tiny_model, mode=mode, **{"orchestration.max_steps": 1, **extra})
    state = train_flow(write_params(cfg, tmp_path / "params.yaml"), return_state=True)
    summary = state.result()
    names = _task_run_names(state.state_details.flow_run_id)
    ckpt = tmp_path / "train" / "checkpoints" / "it_000001"
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == roles
    if mode == "golden":
        assert "execute_golden[it=1]" in names and "rollout_tests[it=1]" not in names
        assert not any(k.startswith("test/") for k in summary)
    else:
        assert {"rollout_tests[it=1]", "execute[it=1]"} <= names
        assert "test/reward_mean" in summary
    if mode == "selfplay":  # one model plays both roles: one update of one policy on both batches
        assert "update_test[it=1]" not in names
        assert summary["grpo/code/samples"] > 2 * 2
    has_book = mode != "golden" and extra.get("mistake_book.enabled", True)
    assert (ckpt / "mistake_book.json").is_file() == has_book
    assert ("mistake_book/size" in summary) == has_book
    # dvc.yaml declares the book as a train out: it must exist in every mode (empty when there is no book)
    book = json.loads((tmp_path / "train" / "mistake_book.json").read_text())
    assert (book["problems"] == {}) or has_book


@pytest.mark.e2e
def test_history_is_recorded_once_per_iteration_and_derived_once(
    prefect_harness, tiny_model, tmp_path, monkeypatch
) -> None:
    """Regression: the history was rewritten in three formats (history.csv, metrics.jsonl,
    metrics.json) every iteration and read back in two. The checkpoint's state holds it (what resume reads);
    history.csv and metrics.json are derived from it once, when the run finishes, and read back the same."""
    import math

    from codea1_core.evaluation.comparison import parse_history
    from flows.train import train_flow
    from workspace import resume

    written: list[int] = []
    real = resume.write_history
    monkeypatch.setattr(resume, "write_history", lambda d, h, *a: written.append(len(h)) or real(d, h, *a))
    cfg = tiny_config(tmp_path, tiny_model, mode="golden", **{"tracking.backend": "null"})
    train_flow(write_params(cfg, tmp_path / "params.yaml"))
    assert written == [2]  # once, with both iterations (not once per iteration plus once at the end)
    out = Path(cfg.orchestration.checkpoint_dir)
    state = json.loads((out / "checkpoints" / "it_000002" / "state.json").read_text())

    def plain(rows: list[dict]) -> list[dict]:  # NaN (nothing replayed) compares unequal to itself
        return [
            {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows
        ]

    assert plain(parse_history((out / "history.csv").read_text())) == plain(state["history"])
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(state["history"][-1]))
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "history.csv",
        "metrics.json",
        "mistake_book.json",
        "timings.csv",  # each iteration's wall-clock values, beside the DVC outputs (written every iteration)
    ]


def test_missing_prepared_data_is_a_user_error(tmp_path: Path) -> None:
    from flows.common import UserError
    from flows.train_run import load_problems

    cfg = Config().replace(**{"data.train_sources": ["mbpp"], "data.prepared_dir": str(tmp_path / "nope")})
    with pytest.raises(UserError, match="nope/train.parquet not found"):
        load_problems(cfg)


def test_overlong_code_prompts_are_filtered_and_test_prompts_limited(
    tiny_model: Path, tmp_path: Path
) -> None:
    """§3: code prompts over data.max_prompt_tokens leave the training set; test rollouts get their limit."""
    from transformers import AutoTokenizer

    from codea1_core.data.lab import lab_problems
    from codea1_core.method.prompts import code_messages
    from codea1_core.models.policy import prompt_lengths
    from codea1_core.models.sampling import sampling_params
    from tasks.rollout import drop_overlong_problems

    cfg = tiny_config(tmp_path, tiny_model)
    problems = lab_problems(cfg.lab, "train")
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    lengths = prompt_lengths(tok, [code_messages(p) for p in problems], True)
    limit = sorted(lengths)[len(lengths) // 2]
    kept, dropped = drop_overlong_problems(problems, cfg.replace(**{"data.max_prompt_tokens": limit}))
    assert [p.id for p in kept] == [p.id for p, n in zip(problems, lengths, strict=True) if n <= limit]
    assert dropped == [p.id for p, n in zip(problems, lengths, strict=True) if n > limit] != []
    assert drop_overlong_problems(problems, cfg.replace(**{"data.max_prompt_tokens": 0})) == (problems, [])
    assert (
        sampling_params(cfg, "rollout", "test", 1).max_prompt_tokens
        == cfg.rollout.max_prompt_tokens_test
        == 8192
    )
    assert sampling_params(cfg, "rollout", "code", 1).max_prompt_tokens == 0


@pytest.mark.e2e
def test_overlapped_execution_trains_exactly_what_the_serial_step_trains(
    prefect_harness, tiny_model, tmp_path
) -> None:
    """``rollout.overlap_execution`` moves the gate and the sandbox into the test rollout's chunks (one prompt
    each here): the history, the Mistake Book, the outcomes and the weights are those of the serial step."""
    from flows.train import train_flow
    from workspace import resume

    outs = {}
    for overlap in (False, True):
        cfg = tiny_config(
            tmp_path / str(overlap),
            tiny_model,
            **{"rollout.batch_size": 1, "rollout.overlap_execution": overlap, "tracking.backend": "null"},
        )
        train_flow(write_params(cfg, tmp_path / f"params-{overlap}.yaml"))
        outs[overlap] = Path(cfg.orchestration.checkpoint_dir)
    serial, piped = outs[False], outs[True]
    for name in (
        "history.csv",
        "mistake_book.json",
        "outcomes/it_000001.parquet",
        "outcomes/it_000002.parquet",
    ):
        assert (piped / name).read_bytes() == (serial / name).read_bytes(), name
    for role in ("code", "test"):
        weights = [sorted((outs[o] / "final" / role).glob("*.safetensors")) for o in (False, True)]
        assert weights[0] and [w.read_bytes() for w in weights[0]] == [w.read_bytes() for w in weights[1]]
    timings = (piped / "timings.csv").read_text().splitlines()[0].split(",")
    assert {"time/overlap_s", "time/overlap/sandbox_s"} <= set(timings)
    assert resume.is_timing("time/overlap_s")
