"""Evaluate stage: benchmark the Code LLM and the Test LLM, write metrics and an HTML report.

What it does (docs/method.md §13), read top to bottom:
  0. check the inputs: every prepared file it reads was prepared with this config's data params, and a few
     references pass their own golden tests under the ``sandbox.*`` limits (one line naming the fix);
  1. resolve the models: ``--code-model/--test-model`` (or the function arguments, or the params keys
     ``eval.code_model/eval.test_model``, e.g. ``codea1 evaluate eval.code_model=DIR``) win, else the latest
     training export ``<orchestration.checkpoint_dir>/final/{code,test}``, else ``model.code_path`` /
     ``model.test_path``;
  2. Code LLM on every ``data.eval_benchmarks`` entry (EvalPlus protocol, ``eval.n_samples`` samples,
     base and plus pass@k / avg@n);
  3. Test LLM on every ``eval.test_sources`` entry (pass@k, mut@k, Mul on the references), and
     test-time collaboration on every ``eval.solve_benchmarks`` entry (``tasks/collaboration.py``);
  4. when the starting models ``model.code_path``/``model.test_path`` are local dirs other than the
     evaluated ones (the lab's warm start), evaluate them too with the same settings and seeds (cached
     under ``<eval.out_dir>/baseline_cache/`` by content hash) as ``warmstart/<key>``, and add
     ``delta/<key>`` = trained - warm start for every rate (``eval.baseline: false`` turns it off);
  5. write ``<eval.out_dir>/metrics.json`` (DVC metrics, flat keys such as ``code/humanevalplus/plus/pass@1``)
     and ``report.html`` (plots embedded; training curves from ``<checkpoint_dir>/history.csv`` when
     present; its "Run" table points at ``runs.json`` beside it, which holds the git commit and run ids: DVC
     outputs hold only what the evaluation decides); log the same numbers and the report with the ids to MLflow through
     ``tracking.results`` (``@`` becomes ``_at_`` there, as MLflow metric names cannot hold ``@``).

What it does not: train or register models (``flows/register.py`` reads ``metrics.json``).

How to run::

    python -m flows.evaluate [--params params.yaml] [--code-model DIR] [--test-model DIR] [key=value ...]
    python -m flows.evaluate --compare outputs/eval/metrics.json other/metrics.json [--out report.html]
"""

from __future__ import annotations

if __name__ == "__main__":  # refused params: one line, before the imports below load Prefect and torch
    from flows.common import check_params_first

    check_params_first("evaluate")

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.atomic import write_text_atomic
from codea1_core.config import Config
from codea1_core.evaluation.report import render_report
from flows.common import (
    UserError,
    check_params_unchanged,
    flow_config,
    flow_run_name,
    load_stage_config,
    params_read,
    record_numerics,
    run_user_errors,
)
from flows.summary import HEADLINE_FILE, headline

log = logging.getLogger(__name__)

BASELINE_PREFIX = "warmstart"
"""Key prefix of the starting models' numbers in ``metrics.json`` (``delta/...`` = trained - baseline)."""
BASELINE_CACHE_VERSION = "2"  # 2: sparse pass@k and mut@k over all suites (new keys)
RATE_TAGS = ("pass@", "avg@", "mut@", "mul")
"""Metric name parts that mark a rate (percent) worth a ``delta/`` key."""


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


def model_role(cfg: Config, role: str) -> str:
    """Which trained model plays ``role``: in ``selfplay`` one model plays both roles (D10)."""
    return "code" if cfg.mode == "selfplay" else role


def evaluated_roles(cfg: Config) -> tuple[str, ...]:
    """``golden`` trains no Test LLM (§14: it is a Code-LLM baseline), so only the code role is evaluated."""
    return ("code",) if cfg.mode == "golden" else ("code", "test")


def start_path(cfg: Config, role: str) -> str:
    """The starting model of ``role`` (``model.code_path`` / ``model.test_path``), mode-aware."""
    return cfg.model.code_path if model_role(cfg, role) == "code" else cfg.model.test_path


def resolve_model_path(cfg: Config, role: str, override: str | None = None) -> str:
    """The model to evaluate for ``role``: argument, ``eval.<role>_model``, latest training export, config path."""
    override = override or (cfg.eval.code_model if role == "code" else cfg.eval.test_model)
    if override:
        return override
    final = Path(cfg.orchestration.checkpoint_dir) / "final" / model_role(cfg, role)
    if final.is_dir():
        return str(final)
    return start_path(cfg, role)


def evaluated_policy(cfg: Config, role: str, override: str | None = None) -> Any:
    """The policy to evaluate (also for ``solve``/``attack``); a model that cannot be loaded is a UserError.

    Built like training's (:func:`codea1_core.models.loading.build_policy`, the one ``rollout.backend`` switch):
    vLLM serves the policy's adapter with the evaluation's sampling settings, HF ``generate`` otherwise.
    The evaluated code and test models are usually different exports, so on vLLM each role gets its own
    engine (half of ``rollout.gpu_memory_utilization`` each), its adapter versions under ``eval.out_dir``.
    """
    from codea1_core.models.loading import build_policy

    path = resolve_model_path(cfg, role, override)
    if cfg.rollout.backend == "vllm":
        cfg = cfg.replace(**{"rollout.shared_engine": False})
    adapters = Path(cfg.eval.out_dir) / "vllm_adapters"
    try:
        return build_policy(path, cfg, role, total_steps=1, adapter_dir=str(adapters))
    except OSError as exc:
        raise UserError(f"{exc} (train or warm-start first, or pass --{role}-model)") from None


def evaluated_benchmarks(cfg: Config) -> list[str]:
    """The benchmarks :func:`_evaluate_models` reads, each once, in the order it reads them."""
    names = list(cfg.data.eval_benchmarks)
    if "test" in evaluated_roles(cfg):
        names += [*cfg.eval.test_sources, *cfg.eval.solve_benchmarks]
    return list(dict.fromkeys(names))


def check_prepared(cfg: Config) -> None:
    """Every prepared file the evaluation reads was prepared with this config's data params
    (``prepared.check_record``); otherwise one line naming the file, the keys and the prepare command."""
    from codea1_core.data.dataset_types import DatasetError
    from codea1_core.data.prepared import check_record

    for name in evaluated_benchmarks(cfg):
        path = Path(cfg.data.prepared_dir) / f"eval_{name}.parquet"
        if path.is_file():  # an absent one is load_benchmark's line; bigcodebench / ULT are read from files
            try:
                check_record(path, cfg)
            except DatasetError as exc:
                raise UserError(str(exc)) from None


def check_references(cfg: Config, executor: Any) -> None:
    """A sample of the first benchmark's references on their own golden tests under the sandbox limits
    (``tasks.execute.check_reference_health``): limits that fail them are one line, before any model loads."""
    from codea1_core.evaluation.benchmarks import load_benchmark
    from tasks.execute import check_reference_health

    names = evaluated_benchmarks(cfg)
    if names:
        check_reference_health(executor, load_benchmark(cfg, names[0]), cfg, "evaluate")


def load_history(cfg: Config) -> list[dict[str, Any]]:
    """Training history (one row per iteration) from ``<checkpoint_dir>/history.csv``, the train stage's file."""
    from codea1_core.evaluation.comparison import parse_history

    path = Path(cfg.orchestration.checkpoint_dir) / "history.csv"
    return parse_history(path.read_text(encoding="utf-8")) if path.is_file() else []


def read_metrics(path: str | Path) -> dict[str, Any]:
    """A metrics JSON file (flat mapping); UserError naming the file otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: metrics file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a JSON metrics file ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object of metrics, got {type(data).__name__}")
    return data


# --------------------------------------------------------------------------------------------------
# The flow
# --------------------------------------------------------------------------------------------------


def _track(cfg: Config, metrics: dict[str, float], report: Path, trained_export: bool) -> None:
    """Log to MLflow; on (and nested under) the training run when its export is what was evaluated."""
    from tracking.results import log_evaluation, training_run_id

    log_evaluation(cfg, metrics, report, training_run_id(cfg) if trained_export else None)


def report_context(cfg: Config) -> dict[str, str]:
    """The report's "Run" table: Prefect flow run, git commit, the MLflow training run and its UI link."""
    from prefect.runtime import flow_run

    from tracking.results import run_link, training_run_id
    from tracking.runs import run_tags

    context = {}
    if flow_run.get_id():
        context["Prefect flow run"] = f"{flow_run.get_name()} ({flow_run.get_id()})"
    context["git commit"] = run_tags().get("git.commit", "unknown")
    run_id = training_run_id(cfg) if cfg.tracking.backend == "mlflow" else None
    if run_id:
        context["MLflow training run"] = run_id
        link = run_link(cfg, run_id)
        if link:
            context["MLflow run (after `codea1 ui`)"] = link
    return context


def _learning_artifact(metrics: dict[str, float], promote: str) -> None:
    """The learning table as a markdown artifact of this flow run (Prefect UI: the run's Artifacts tab)."""
    from prefect.artifacts import create_markdown_artifact

    from flows.summary import learning_markdown

    create_markdown_artifact(
        markdown=learning_markdown(metrics, promote),
        key="codea1-learning",
        description="warm start -> trained",
    )


def _evaluate_models(
    cfg: Config, code_policy: Any, test_policy: Any, executor: Any, mutant_dir: str, solve: bool = True
) -> dict[str, float]:
    """Code LLM on ``data.eval_benchmarks``, Test LLM on ``eval.test_sources`` (+ solve benchmarks)."""
    from codea1_core.evaluation.benchmarks import lab_subsets, load_benchmark
    from tasks.collaboration import solve_benchmark
    from tasks.evaluate import evaluate_code_task
    from tasks.evaluate_tests import evaluate_tests_task

    metrics: dict[str, float] = {}
    for bench in cfg.data.eval_benchmarks:
        problems = load_benchmark(cfg, bench)
        metrics |= evaluate_code_task(code_policy(), problems, cfg, executor, bench, lab_subsets(problems))
    for source in cfg.eval.test_sources if "test" in evaluated_roles(cfg) else []:
        problems = load_benchmark(cfg, source)
        metrics |= evaluate_tests_task(
            test_policy(), problems, cfg, executor, source, mutant_dir, lab_subsets(problems)
        )
    for bench in cfg.eval.solve_benchmarks if solve and "test" in evaluated_roles(cfg) else []:
        metrics |= solve_benchmark(
            load_benchmark(cfg, bench), code_policy(), test_policy(), cfg, executor, bench
        )
    return metrics


def _lazy(policy: Any, cfg: Config, role: str, override: str | None) -> Any:
    """A zero-argument getter that loads the role's policy on first use (or returns the given one)."""
    cache = [policy]

    def get() -> Any:
        if cache[0] is None:
            cache[0] = evaluated_policy(cfg, role, override)
        return cache[0]

    return get


def baseline_paths(cfg: Config, code_model: str | None, test_model: str | None) -> dict[str, str] | None:
    """The starting models (``model.code_path``/``test_path``) when they are local dirs other than the
    evaluated ones — the warm start of the default lab run; ``None`` when there is nothing to compare."""
    if not cfg.eval.baseline:
        return None
    roles = evaluated_roles(cfg)
    paths = {role: start_path(cfg, role) for role in roles}
    overrides = {"code": code_model, "test": test_model}
    evaluated = {role: resolve_model_path(cfg, role, overrides[role]) for role in roles}
    if not all(Path(p).is_dir() for p in paths.values()):
        return None
    if all(Path(paths[r]).resolve() == Path(evaluated[r]).resolve() for r in paths):
        return None
    return paths


def _dir_digest(path: Path, h: Any) -> None:
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")


ROLLOUT_TRAINING_ONLY = (
    "n_code",
    "n_tests",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens_code",
    "max_new_tokens_test",
    "max_prompt_tokens_test",
)
"""``rollout`` keys only training's sampling reads (the evaluation samples with ``eval.*``); every other
``rollout`` key decides how the evaluation generates: ``batch_size`` splits the prompts into chunks, each
seeded by its offset, so it changes the samples; ``backend`` and the engine keys choose the kernels."""


def baseline_cache_key(cfg: Config, paths: dict[str, str]) -> str:
    """Content hash of the baseline models, every setting the evaluation reads and the evaluated data files.

    Everything that changes the warm start's numbers is in the key (the ``model`` section, the ``rollout`` keys
    generation reads, ``eval``, ...), so an entry written under other params is never read back as this
    run's warm start: the warm-start column is the same whichever entry point evaluates it.
    """
    import dataclasses
    import hashlib

    h = hashlib.sha256(f"{BASELINE_CACHE_VERSION}\0{cfg.seed}\0".encode())
    generation = {k: v for k, v in dataclasses.asdict(cfg.rollout).items() if k not in ROLLOUT_TRAINING_ONLY}
    settings = [
        cfg.eval,
        cfg.data.eval_benchmarks,
        cfg.reward.k,
        cfg.tests,
        cfg.sandbox,
        cfg.model,
        generation,
    ]
    h.update(json.dumps(settings, default=str, sort_keys=True).encode())
    for role in sorted(paths):
        _dir_digest(Path(paths[role]), h)
    for name in sorted({*cfg.data.eval_benchmarks, *cfg.eval.test_sources}):
        data = Path(cfg.data.prepared_dir) / f"eval_{name}.parquet"
        h.update(data.read_bytes() if data.is_file() else name.encode())
    return h.hexdigest()


def baseline_metrics(cfg: Config, paths: dict[str, str], executor: Any, mutant_dir: str) -> dict[str, float]:
    """Metrics of the starting models with the same protocol and seeds, cached by content hash."""
    cache = Path(cfg.eval.out_dir) / "baseline_cache" / f"{baseline_cache_key(cfg, paths)}.json"
    if cache.is_file():
        try:
            return {k: float(v) for k, v in json.loads(cache.read_text(encoding="utf-8")).items()}
        except (ValueError, AttributeError, TypeError):
            log.warning("%s: damaged baseline cache entry, re-evaluating", cache)
    code = _lazy(None, cfg, "code", paths["code"])
    test = _lazy(None, cfg, "test", paths.get("test"))  # never called in golden mode
    metrics = _evaluate_models(cfg, code, test, executor, mutant_dir, solve=False)
    write_text_atomic(cache, json.dumps(metrics, sort_keys=True) + "\n")
    return metrics


def with_baseline(metrics: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """``metrics`` plus ``warmstart/<key>`` for every baseline number and ``delta/<key>`` for every rate."""
    out = dict(metrics)
    for key, value in base.items():
        out[f"{BASELINE_PREFIX}/{key}"] = value
        if key in metrics and any(tag in key.rsplit("/", 1)[-1] for tag in RATE_TAGS):
            out[f"delta/{key}"] = metrics[key] - value
    return out


@flow(name="evaluate", flow_run_name=flow_run_name)
def evaluate_flow(
    params: str = "params.yaml",
    overrides: list[str] | None = None,
    code_model: str = "",
    test_model: str = "",
    run_dir: str = "",
) -> dict[str, float]:
    """Prefect entry point (DVC stage, CLI, the ``evaluate/codea1-evaluate`` deployment): :func:`evaluate` with a
    params file + overrides; ``code_model``/``test_model`` as ``--code-model``/``--test-model``. With ``run_dir``
    that training run's models are evaluated into ``<run_dir>/eval``; ``run_dir="auto"`` evaluates the
    workspace's models into a new run folder."""
    from flows.console import quiet_user_error_tracebacks

    cfg = flow_config(params, overrides, run_dir, keep_train_dir=True)
    quiet_user_error_tracebacks()  # a refused input is its one line, here as in a deployment's run
    check_prepared(cfg)
    record_numerics(cfg, "evaluate")
    return evaluate(cfg, code_model or None, test_model or None)


def _evaluate(
    cfg: Config,
    code_model: str | None = None,
    test_model: str | None = None,
    code_policy: Any = None,
    test_policy: Any = None,
    executor: Any = None,
    baseline_policies: tuple[Any, Any] | None = None,
) -> dict[str, float]:
    """Benchmarks -> ``metrics.json`` + ``report.html`` (+ MLflow). Policies/executor may be injected.

    The starting models (the warm start) are evaluated too, with the same settings and seeds, as
    ``warmstart/...`` keys with ``delta/...`` = trained - warm start (``eval.baseline``, §19).
    """
    from codea1_core.method.parsing import silence_parse_warnings

    silence_parse_warnings()  # warnings about generated text stay off the console
    out_dir = Path(cfg.eval.out_dir)
    code_label = "(given policy)" if code_policy is not None else resolve_model_path(cfg, "code", code_model)
    test_label = "(given policy)" if test_policy is not None else resolve_model_path(cfg, "test", test_model)
    if "test" not in evaluated_roles(cfg):
        test_label = "(not evaluated: golden mode trains no Test LLM)"
    injected = code_policy is not None or test_policy is not None
    base_paths = None if injected else baseline_paths(cfg, code_model, test_model)
    own_executor = executor is None
    if own_executor:
        from sandbox import make_executor

        executor = make_executor(cfg.sandbox)
    mutant_dir = str(out_dir / "mutants")
    try:
        if own_executor:  # the stage's own sandbox: its limits checked on a few references first
            check_references(cfg, executor)
        code = _lazy(code_policy, cfg, "code", code_model)
        test = _lazy(test_policy, cfg, "test", test_model)
        metrics = _evaluate_models(cfg, code, test, executor, mutant_dir)
        if baseline_policies is not None and cfg.eval.baseline:
            base = _evaluate_models(
                cfg, *(lambda p=p: p for p in baseline_policies), executor, mutant_dir, False
            )
            metrics = with_baseline(metrics, base)
        elif base_paths is not None:
            metrics = with_baseline(metrics, baseline_metrics(cfg, base_paths, executor, mutant_dir))
    finally:
        if own_executor:
            executor.close()
    # ---- Outputs --------------------------------------------------------------------------------
    metrics = {k: round(float(v), 4) for k, v in sorted(metrics.items())}
    write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True) + "\n")
    top = headline(metrics, cfg.eval.promote_metric)  # the learning table: DVC's `metrics` file
    write_text_atomic(out_dir / HEADLINE_FILE, json.dumps(top, indent=1) + "\n")
    _learning_artifact(metrics, cfg.eval.promote_metric)
    report = out_dir / "report.html"
    notes = [f"code model: {code_label}", f"test model: {test_label}"]
    if base_paths:
        notes.append(f"baseline ({BASELINE_PREFIX}/...): {', '.join(base_paths.values())}")
    context = report_context(cfg)
    page = render_report(
        metrics,
        history=load_history(cfg),
        notes=notes,
        promote=cfg.eval.promote_metric,
        context=context,
        params=cfg.flat(),
    )
    write_text_atomic(report, workspace_page(page, context, out_dir))
    if cfg.tracking.backend != "null":
        import tempfile

        final = Path(cfg.orchestration.checkpoint_dir) / "final"
        with tempfile.TemporaryDirectory() as tmp:  # MLflow's copy names its runs
            (Path(tmp) / report.name).write_text(page, encoding="utf-8")
            _track(cfg, metrics, Path(tmp) / report.name, not injected and Path(code_label).parent == final)
    return metrics


RUN_IDS_FILE = "runs.json"
"""Beside ``report.html``, not a DVC output: the git commit, Prefect flow run and MLflow runs of this evaluation."""


def workspace_page(page: str, context: dict[str, str], out_dir: Path) -> str:
    """``page`` with its "Run" table replaced by a pointer to :data:`RUN_IDS_FILE`, which gets the table's rows.

    Why: the commit, ids and links differ between two runs of the same inputs (new runs; a later commit, such as
    the one that records the first run's ``dvc.lock``), so the DVC output holding them would change ``dvc.lock``
    whatever the evaluation decides. The report logged to MLflow keeps the whole table."""
    from codea1_core.atomic import write_json_atomic
    from codea1_core.evaluation.report import context_table

    if not context:
        return page
    write_json_atomic(out_dir / RUN_IDS_FILE, context)
    full = context_table(context)
    if full not in page:
        raise RuntimeError(
            "render_report no longer writes context_table(context) as it is: keep the two in step"
        )
    where = (
        f"{out_dir / RUN_IDS_FILE} (git commit, Prefect and MLflow runs), and this report's copy in MLflow"
    )
    return page.replace(full, context_table({"run": where}), 1)


def evaluate(
    cfg: Config,
    code_model: str | None = None,
    test_model: str | None = None,
    code_policy: Any = None,
    test_policy: Any = None,
    executor: Any = None,
    baseline_policies: tuple[Any, Any] | None = None,
) -> dict[str, float]:
    """The evaluation of :func:`evaluate_flow` on a loaded config (policies/executor may be injected, as tests
    do); returns the flat metrics written to ``metrics.json``. A folder that cannot take the outputs fails before
    any model runs (:func:`check_out_dir`); a disk or MLflow store failure on the way is one line
    (``flows.console.failure_line``)."""
    from flows.console import failure_line

    check_out_dir(Path(cfg.eval.out_dir))
    try:
        return _evaluate(cfg, code_model, test_model, code_policy, test_policy, executor, baseline_policies)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:
        line = failure_line(exc, cfg, then="rerun the evaluation")
        if line is None:
            raise
        raise UserError(line) from None


OUT_DIR_PROBE_BYTES = 4 << 20
"""What :func:`check_out_dir` writes: more than ``metrics.json``, ``headline.json`` and ``report.html`` of an
evaluation take."""


def check_out_dir(out_dir: Path) -> None:
    """Fail in one line, before minutes of evaluation, when ``eval.out_dir`` cannot take the outputs: a real write
    of :data:`OUT_DIR_PROBE_BYTES` (a full, read-only or over-quota disk fails it), removed again."""
    import os

    probe = out_dir / f".codea1-space-probe.{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            for _ in range(OUT_DIR_PROBE_BYTES >> 20):
                fh.write(bytes(1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise UserError(
            f"eval.out_dir={out_dir}: {exc.strerror or exc} (a {OUT_DIR_PROBE_BYTES >> 20} MiB test write before "
            "the evaluation failed): free space there or point eval.out_dir elsewhere, then rerun"
        ) from None
    finally:
        probe.unlink(missing_ok=True)


def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, float]:
    """``codea1 evaluate`` (``flows.common.stage_main``): :func:`evaluate_flow` with the stage's arguments."""
    from flows.console import quiet_user_error_tracebacks

    quiet_user_error_tracebacks()
    return evaluate_flow(params, list(overrides or []))


def compare(paths: list[str], out: str | Path) -> Path:
    """Comparison report of several metrics files (one column per file) written to ``out``."""
    if len(paths) < 2:
        raise UserError("--compare needs at least two metrics files")
    runs = {}
    for p in paths:
        name = str(p)
        runs[name if name not in runs else f"{name} ({len(runs)})"] = read_metrics(p)
    first = next(iter(runs.values()))
    out = Path(out)
    write_text_atomic(
        out,
        render_report(first, runs=runs, title="codea1 run comparison", notes=[f"runs: {', '.join(runs)}"]),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.evaluate`` / ``codea1 evaluate``; exit 2 with one line on user errors."""
    from tracking.store import TrackingUnavailable, probe_if_used

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description="Evaluate the Code LLM and the Test LLM on benchmarks.")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--code-model", default=None, help="Code-LLM model dir (default: latest export)")
    parser.add_argument("--test-model", default=None, help="Test-LLM model dir (default: latest export)")
    parser.add_argument("--compare", nargs="+", metavar="METRICS_JSON", help="compare metrics files instead")
    parser.add_argument(
        "--out", default=None, help="report path for --compare (default: outputs/eval/compare.html)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. eval.n_samples=4")
    args = parser.parse_args(argv)

    def go() -> None:
        from flows.console import quiet_user_error_tracebacks

        quiet_user_error_tracebacks()  # a store or disk failure: its one line, not Prefect's traceback
        if args.compare:
            out = args.out or "outputs/eval/compare.html"
            print(f"wrote {compare(args.compare, out)}")
            return
        cfg = load_stage_config(args.params, list(args.overrides))  # a bad file: one line, before Prefect
        check_prepared(cfg)  # another config's data too
        try:  # an unusable MLflow store: one line now, not minutes of retries after the evaluation
            probe_if_used(cfg)
        except TrackingUnavailable as exc:
            raise UserError(str(exc)) from None
        started = params_read(args.params, list(args.overrides))
        metrics = evaluate_flow(
            args.params, list(args.overrides), args.code_model or "", args.test_model or ""
        )
        if started is not None:  # an edit during the evaluation: DVC must not record it as evaluated
            check_params_unchanged(args.params, list(args.overrides), started, "evaluate")
        for key, value in metrics.items():
            print(f"{key}: {value}")
        print(f"wrote {Path(cfg.eval.out_dir) / 'metrics.json'} and {Path(cfg.eval.out_dir) / 'report.html'}")

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
