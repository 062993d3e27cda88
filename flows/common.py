"""Shared entry-point plumbing for the flows: ``python -m flows.<stage> [--params FILE] [key=value ...]``.

Every DVC stage and every ``codea1`` subcommand goes through :func:`stage_main`, so a malformed
``params.yaml`` or override always ends in one clear line naming the file and dotted key (exit 2),
never a traceback (``python -m flows.<stage>`` checks them first, :func:`check_params_first`, so the line
comes before the stage's imports load Prefect and torch); and a params file edited while the stage ran fails
it at its end, naming the changed keys (:func:`check_params_unchanged`), so DVC never records values the
outputs were not made with.

One flow signature: every Prefect flow takes ``params`` (a params file) and ``overrides`` (``key=value``
strings) and loads its config itself with :func:`flow_config`, so the flow a DVC stage runs, the one the CLI
runs and the one a deployment schedules are the same function, with JSON-friendly parameters the Prefect UI
shows. One parse per stage: the entry's check, the stage's ``run``, the flow run's name and the flow's body all
get their config from :func:`stage_config`, which parses a params file once per process. Flows that write
outputs also take ``run_dir`` (``""``: the DVC workspace; ``"auto"``: a new
``runs/<flow run name>-<id>/``, what deployments default to; else that folder). :func:`flow_run_name` names
every flow run ``<flow>-<mode>-seed<seed>[-alpha..][-no-book][-<other overrides>]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from codea1_core.atomic import write_json_atomic
from codea1_core.config import Config, ConfigError, load_config, read_params
from flows.environment import pin_numerics

RUNS_DIR = Path("runs")
"""Where deployment runs write (``run_dir="auto"``): never into the DVC workspace's ``outputs/``."""
AUTO_RUN_DIR = "auto"

PROJECT_LOGGERS = ("codea1", "codea1_core", "tasks", "flows", "sandbox")
"""Logger names of this project (``codea1.<part>`` and module loggers); their INFO lines reach the console."""


def child_env() -> dict[str, str]:
    """This process's environment with this interpreter's ``bin/`` first on ``PATH``, for child processes
    (``dvc`` and the stages it runs call ``python``: it must be this environment's)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class UserError(Exception):
    """A mistake the user can fix (bad input, missing file): printed as one line, exit 2."""


def _stage_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. reward.alpha=0.25")
    return parser


def parse_stage_args(
    argv: list[str] | None, description: str, prog: str | None = None
) -> tuple[str, list[str]]:
    args = _stage_arguments(argparse.ArgumentParser(prog=prog, description=description)).parse_args(argv)
    return args.params, list(args.overrides)


class _NotPlain(Exception):
    """The arguments are not only ``[--params FILE] [key=value ...]``."""


class _PlainArgs(argparse.ArgumentParser):
    """A stage's ``--params`` and overrides, raising :class:`_NotPlain` where argparse would print and exit."""

    def error(self, message: str) -> NoReturn:
        raise _NotPlain(message)


def plain_stage_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """``argv`` as :func:`parse_stage_args` reads it when it holds only ``[--params FILE] [key=value ...]``;
    None for anything else (``--help``, a stage's other options, an argparse mistake), which the stage's own
    parser handles."""
    try:
        args, rest = _stage_arguments(_PlainArgs(add_help=False)).parse_known_args(argv)
    except _NotPlain:
        return None
    return None if rest else (args.params, list(args.overrides))


_LOADED: dict[tuple[str, tuple[str, ...]], tuple[str, Config]] = {}
"""(resolved params path, overrides) -> (the file's text, its Config): what :func:`stage_config` parsed."""
_LOADED_MAX = 16


ALL_CHECKS = ("metrics", "models")
"""What :func:`check_loaded` can check: ``metrics`` (the promotion metrics are names the evaluate stage writes:
evaluate, register) and ``models`` (device and generation budgets: the stages that run a model)."""
STAGE_CHECKS: dict[str, tuple[str, ...]] = {"prepare": (), "register": ("metrics",)}
"""The load-time checks of the stages that run no model (``stage_checks``); the others: all."""


def stage_checks(stage: str) -> tuple[str, ...]:
    """What :func:`check_loaded` checks for ``stage`` (``prepare``, ``train``...) when it starts."""
    return STAGE_CHECKS.get(stage, ALL_CHECKS)


def stage_config(params: str | Path, overrides: list[str] | None = None) -> Config:
    """``params`` + ``overrides`` as a validated :class:`Config`, parsed and validated once per process.

    A stage needs its config in several places (the entry's check before any Prefect run, the stage's ``run``,
    the flow run's name, the flow's body); each gets the same Config. The file is read every time, so an edited
    file (a worker serving several deployment runs) is parsed again; a file that does not load raises its
    ConfigError every time (nothing is kept for it).
    """
    text = read_params(params)
    key = (str(Path(params).resolve()), tuple(overrides or ()))
    kept = _LOADED.get(key)
    if kept is not None and kept[0] == text:
        return kept[1]
    cfg = load_config(params, list(overrides or ()), text=text)
    if len(_LOADED) >= _LOADED_MAX:
        _LOADED.clear()
    _LOADED[key] = (text, cfg)
    return cfg


def load_stage_config(params: str, overrides: list[str], checks: tuple[str, ...] = ALL_CHECKS) -> Config:
    """Load and validate params (ConfigError with a one-line message), check them against this machine
    (:func:`check_loaded`, the ``checks`` the stage needs) and pin torch's CPU threads
    (:func:`pin_cpu_threads`): every stage's entry and the CLI commands that run models outside a flow
    (``solve``, ``attack``) load here."""
    cfg = stage_config(params, overrides)
    check_loaded(cfg, params, checks)
    pin_numerics(cfg.model.cpu_numerics)
    pin_cpu_threads(cfg)
    return cfg


def check_loaded(cfg: Config, source: str | Path, checks: tuple[str, ...] = ALL_CHECKS) -> None:
    """What a loaded config must also satisfy before a stage starts: the promotion metrics are names the
    evaluate stage writes (``codea1_core.config.check_metric_names``), ``model.device`` exists, and every
    generation budget fits its model's context (``codea1_core.models.preflight``). Imports no torch unless
    ``model.device`` names CUDA."""
    from codea1_core.config import check_metric_names
    from codea1_core.models.preflight import check_models

    if "metrics" in checks:
        check_metric_names(cfg.flat(), str(source))
    if "models" in checks:
        check_models(cfg, ("code",) if cfg.mode == "golden" else ("code", "test"), hub=False)


PLAIN = (int, float, str, bool, type(None))
"""Argument types a Prefect task gets as they are; see :func:`quoted`."""


def quoted(
    args: tuple, kwargs: dict[str, Any] | None = None, plain: tuple[type, ...] = PLAIN
) -> tuple[tuple, dict[str, Any]]:
    """``args`` and ``kwargs`` as a Prefect task is given them: ``plain`` values as they are, anything else
    ``quote``-d, so Prefect does not walk it for futures (problem sets, metric dicts, B*M*N completions with
    their token ids would otherwise be visited element by element on every call)."""
    from prefect.utilities.annotations import quote

    def one(a: Any) -> Any:
        return a if isinstance(a, plain) else quote(a)

    return tuple(map(one, args)), {k: one(v) for k, v in (kwargs or {}).items()}


def stage_task(task: Any, *args: Any) -> Any:
    """Run ``task`` as a Prefect task run when called inside a flow run (a named step of the stage in the Prefect
    UI), as its plain function otherwise (a test or bench calling the stage's function directly); arguments as
    :func:`quoted` gives them. (Training's tasks, with their time-out: ``flows.steps.as_task``.)"""
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return getattr(task, "fn", task)(*args)
    return task(*quoted(args)[0])


def run_user_errors(fn: Callable[[], Any]) -> int:
    """Run ``fn``; turn user mistakes (ConfigError, UserError) into one line on stderr and exit code 2."""
    try:
        fn()
    except (ConfigError, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def params_read(params: str | Path, overrides: list[str] | None = None) -> str | None:
    """The text of ``params`` that :func:`stage_config` last parsed with ``overrides`` (None before any)."""
    kept = _LOADED.get((str(Path(params).resolve()), tuple(overrides or ())))
    return None if kept is None else kept[0]


def stage_params(stage: str, dvc_file: str | Path = "dvc.yaml") -> list[str] | None:
    """The ``params.yaml`` keys ``dvc_file`` declares for ``stage`` (a section name stands for every key in
    it), the values DVC records in ``dvc.lock``; None when the file or the stage is not there."""
    import yaml

    try:
        declared = yaml.safe_load(Path(dvc_file).read_text(encoding="utf-8"))["stages"][stage].get("params")
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None
    return [k for k in declared or [] if isinstance(k, str)]


def check_params_unchanged(params: str | Path, overrides: list[str] | None, started: str, stage: str) -> None:
    """Raise a one-line :class:`UserError` when ``params`` no longer gives the values the stage ran with.

    A stage reads its params when it starts; DVC reads them again when the stage's command exits and records
    those in ``dvc.lock``. An edit in between would record values the outputs were not made with, and the next
    ``dvc repro`` would call them up to date. Called at the end of every stage, before it reports success:
    compares the config of ``started`` (the text the stage read) with the file now, ``overrides`` applied to
    both, on the keys ``dvc.yaml`` declares for the stage when DVC runs it (``$DVC_STAGE``), on every key
    otherwise; byte-identical files are not parsed again.
    """
    try:
        now = read_params(params)
    except ConfigError as exc:
        now, why = None, str(exc)
    if now == started:
        return
    before = load_config(params, list(overrides or ()), text=started).flat()
    changed: list[str] = []
    if now is not None:
        try:
            after = load_config(params, list(overrides or ()), text=now).flat()
        except ConfigError as exc:
            why = f"it no longer loads: {exc}"
        else:
            dvc_stage = os.environ.get("DVC_STAGE")
            keys = stage_params(dvc_stage) if dvc_stage else None
            changed = [
                f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
                for k in sorted(set(before) | set(after))
                if before.get(k) != after.get(k)
                and (keys is None or any(k == d or k.startswith(f"{d}.") for d in keys))
            ]
            if not changed:
                return
            more = f", and {len(changed) - 3} more" if len(changed) > 3 else ""
            why = ", ".join(changed[:3]).replace("'", "") + more
    raise UserError(
        f"{params} changed while the {stage} stage ran ({why}): its outputs were made with the values it read "
        f"at the start and are not recorded as made with the new ones; run the stage again (`dvc repro {stage}`, "
        f"or `codea1 {stage}`)"
    )


def stage_main(
    run: Callable[[str, list[str]], Any],
    description: str,
    argv: list[str] | None = None,
    prog: str | None = None,
    checks: tuple[str, ...] = ALL_CHECKS,
) -> int:
    """``python -m flows.<stage>``: parse args, validate the params, call ``run(params, overrides)``; exit code.

    The config is validated here first, so a bad file or override is one line before any Prefect run starts;
    ``run`` (the stage's entry) then calls its flow with the same ``params`` and ``overrides``. ``checks``:
    what :func:`check_loaded` checks for this stage.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Prefect has usually configured the root logger already (level WARNING, its console handler), which makes
    # basicConfig a no-op: our own INFO lines (warm-start epochs, checkpoint notes) need their loggers' level set.
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    params, overrides = parse_stage_args(argv, description, prog)

    def go() -> None:
        try:
            load_stage_config(params, overrides, checks)
        except ConfigError as exc:
            raise with_dvc_recovery(exc) from None
        started = params_read(params, overrides)
        run(params, overrides)
        if started is not None:  # before the exit code that lets DVC record the params it reads now
            check_params_unchanged(params, overrides, started, _stage_name(run))

    return run_user_errors(go)


def with_dvc_recovery(exc: ConfigError) -> ConfigError:
    """``exc``, naming how to get the stage's outputs back when DVC runs the stage (``$DVC_STAGE``): DVC removes
    them before it runs the stage's command."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return exc
    return ConfigError(
        f"{exc} (DVC removed stage {stage!r}'s outputs before running it: `dvc checkout {stage}` "
        "restores the cached ones, `git checkout outputs/` the versioned ones)"
    )


def check_params_first(stage: str, argv: list[str] | None = None) -> None:
    """The first statement of ``python -m flows.<stage>`` (DVC's command): a params file or override the stage
    refuses ends the process with its one line (exit 2) before the stage module's imports load Prefect and
    torch, which take seconds.

    Checks what the stage's entry checks first (:func:`stage_config`, :func:`check_loaded` with
    :func:`stage_checks`) and changes nothing: no numerics or threads pinned. It returns when they pass, and
    without checking when ``argv`` (default: ``sys.argv[1:]``) is more than ``[--params FILE] [key=value ...]``
    (:func:`plain_stage_args`); the stage's entry then parses and checks as always, the parse taken from
    :func:`stage_config`'s cache.
    """
    args = plain_stage_args(sys.argv[1:] if argv is None else argv)
    if args is None:
        return

    def check() -> None:
        try:
            check_loaded(stage_config(*args), args[0], stage_checks(stage))
        except ConfigError as exc:
            raise with_dvc_recovery(exc) from None

    code = run_user_errors(check)
    if code:
        raise SystemExit(code)


def _stage_name(run: Callable[..., Any]) -> str:
    """``prepare``, ``train``...: the stage a ``flows.<stage>.run`` entry runs (``python -m flows.<stage>`` names
    its module ``__main__``: its spec keeps the real name)."""
    module = getattr(run, "__module__", "") or ""
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", "") or ""
    return module.rpartition(".")[2] or "stage"


# --------------------------------------------------------------------------------------------------
# One flow signature: (params, overrides[, run_dir]) -> the run's config and its name
# --------------------------------------------------------------------------------------------------


_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pin_cpu_threads(cfg: Config) -> None:
    """Give torch ``model.cpu_threads`` CPU threads in this process (0: leave torch's default alone).

    The count decides how CPU kernels split their sums, so it is part of what a seed reproduces. Torch imported
    already gets ``set_num_threads``; one imported later reads the environment variables set here.
    """
    n = cfg.model.cpu_threads
    if n <= 0:
        return
    for var in _THREAD_VARS:
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


def record_numerics(cfg: Config, stage: str) -> dict[str, str]:
    """Write what decides this stage's CPU rounding to ``<outputs>/numerics/<stage>.json`` and return it.

    ``<outputs>`` is the folder above ``orchestration.checkpoint_dir`` (``outputs/`` in the workspace). Not a
    DVC output on purpose: the CPU model is a fact of the machine, and inside a tracked output it would make
    every other machine's ``dvc status`` report a change. The training run's MLflow tags carry the same.
    """
    from codea1_core.models import cpu_numerics

    record = cpu_numerics.describe(cfg.model.cpu_numerics)
    folder = Path(cfg.orchestration.checkpoint_dir).parent / "numerics"
    write_json_atomic(folder / f"{stage}.json", record, indent=1)
    if record["mode"] == "reproducible" and record["aten_capability"] != "AVX2":
        logging.getLogger("codea1.numerics").warning(
            "model.cpu_numerics: reproducible, but this CPU runs ATen's %s kernels (no AVX2): its numbers differ "
            "from an AVX2 CPU's",
            record["aten_capability"],
        )
    return record


def flow_config(
    params: str = "params.yaml",
    overrides: list[str] | None = None,
    run_dir: str = "",
    *,
    keep_train_dir: bool = False,
) -> Config:
    """The config a flow run uses: ``params`` + ``overrides`` validated (ConfigError naming the key), written into
    ``run_dir`` (:func:`resolve_run_dir`) when one is given.

    ``keep_train_dir``: with ``run_dir="auto"`` the training folder stays the workspace's (a new run folder has
    nothing trained in it: the evaluate deployment evaluates the workspace's models into the new folder).
    """
    cfg = stage_config(params, overrides)
    pin_numerics(cfg.model.cpu_numerics)  # before torch's first CPU kernel: the kernel levels
    pin_cpu_threads(cfg)  # before any model work: the thread count is part of what a seed reproduces
    folder = resolve_run_dir(run_dir)
    if folder is None:
        return cfg
    train_dir = (
        cfg.orchestration.checkpoint_dir if keep_train_dir and run_dir == AUTO_RUN_DIR else folder / "train"
    )
    return cfg.replace(
        **{"orchestration.checkpoint_dir": str(train_dir), "eval.out_dir": str(folder / "eval")}
    )


def resolve_run_dir(run_dir: str) -> Path | None:
    """``""`` -> None (the workspace, as the DVC stages write); ``"auto"`` -> ``runs/<flow run name>-<id>`` of the
    current flow run (unique: two runs never share checkpoints); anything else -> that folder."""
    if not run_dir:
        return None
    if run_dir != AUTO_RUN_DIR:
        return Path(run_dir)
    from prefect.runtime import flow_run

    name = f"{flow_run.get_name() or 'run'}-{str(flow_run.get_id() or 'local')[:8]}"
    return RUNS_DIR / re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def run_label(cfg: Config) -> str:
    """``<mode>-seed<seed>[-alpha<α>][-no-book]``: runs that differ in what they train are told apart."""
    book = "" if cfg.mistake_book.enabled or cfg.mode == "golden" else "-no-book"
    alpha = "" if cfg.mode == "golden" else f"-alpha{cfg.reward.alpha:g}"
    return f"{cfg.mode}-seed{cfg.seed}{alpha}{book}"


NAMED_OVERRIDES = ("mode=", "seed=", "reward.alpha=")
"""Overrides :func:`run_label` already shows; the others are appended to a flow run's name."""


def flow_run_name() -> str:
    """The current flow run's name, ``<flow>-<run_label>[-<other overrides>]``, from its ``params``/``overrides``
    parameters (every flow's ``flow_run_name``); a config that does not load fails in the flow itself."""
    from prefect.runtime import flow_run

    p = dict(flow_run.get_parameters() or {})
    flow_name = flow_run.get_flow_name() or "run"
    overrides = list(p.get("overrides") or [])
    try:
        cfg = stage_config(p.get("params") or "params.yaml", overrides)
    except Exception:  # a bad parameter fails in the flow itself, with its own message
        return f"{flow_name}-invalid-config"
    keys = [o for o in overrides if not o.startswith(NAMED_OVERRIDES)]
    return "-".join([f"{flow_name}-{run_label(cfg)}", *keys])
