"""The ``prepare`` stage: problem sources -> reference-verified parquet sets (docs/method.md §12, D1).

What it does, top to bottom:
  1. Load ``data.train_sources`` (-> ``train``), ``data.val_sources`` (-> ``val``) and every
     ``data.eval_benchmarks`` entry (-> ``eval_<name>``) with ``codea1_core.data.datasets``; a source whose
     files are absent (no data folder, no network for a hub id) is skipped and reported, never guessed.
     ``data.max_problems_per_source`` caps each source after a seeded shuffle (original order kept).
  2. Run every reference solution on its golden calls (and on the dataset's own asserts) in the
     sandbox, with ``data.reference_call_timeout_s`` per call and ``data.reference_memory_mb`` per program
     (EvalPlus' 4 GiB, not the samples' ``sandbox.memory_mb``). Outcomes are cached by content
     (``<prepared_dir>/../cache/expected/<sha256>.json``: reference + expressions + limits + the sandbox's
     version, each entry checksummed: one that does not match is recomputed with a warning), so a rerun
     with the same inputs executes nothing. Infrastructure failures abort the stage (D4), uncached.
  3. Fill expected values from the reference, drop golden tests the reference cannot answer or whose
     dataset claim disagrees (``prepared.resolve``), reject problems left without tests, then gate every
     set with Great Expectations (``tasks.quality.validate_problems``).
  4. Write ``train.parquet``, ``val.parquet``, ``eval_<name>.parquet`` (each with the record of the params
     that decided it, ``prepared.prepared_record``: train and evaluate refuse a file another config
     prepared) and ``report.json`` (counts per
     source, rejected problems, excluded tests and unparsed dataset asserts with reasons, skipped
     sources with reasons), each
     atomically, only after everything succeeded; print a summary table. Those DVC-tracked files hold
     only what the inputs decide, so a rerun writes the same bytes and ``dvc status`` stays clean; what
     differs per run (seconds, sandbox programs run, cache hits) goes to the untracked
     ``<prepared_dir>/../cache/prepare_run.json`` (:data:`RUN_FIELDS`).

What it does not: train, evaluate, or download EvalPlus/MBPP (offline files only; KodCode may come from
the hub through ``datasets``). How to run: ``python -m flows.prepare [key=value ...]`` or
``codea1 prepare``; DVC stage ``prepare``.
"""

from __future__ import annotations

if __name__ == "__main__":  # refused params: one line, before the imports below load Prefect and torch
    from flows.common import check_params_first

    check_params_first("prepare")

import base64
import dataclasses
import hashlib
import json
import logging
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.atomic import write_bytes_atomic
from codea1_core.config import Config, resolve_data_dir
from codea1_core.data.dataset_types import DatasetError, SourceUnavailable
from codea1_core.data.datasets import load_source
from codea1_core.data.prepared import (
    chunk_exprs,
    load_prepared,
    prepared_record,
    reference_exprs,
    rerun_alone,
    resolve,
    save_prepared,
)
from codea1_core.types import CallOutcome, Problem
from codea1_core.values import decode, encode
from flows.common import UserError, flow_config, flow_run_name, stage_checks, stage_main, stage_task
from tasks.execute import run_jobs

log = logging.getLogger(__name__)

__all__ = ["load_prepared", "main", "prepare", "prepare_flow", "run", "save_prepared"]

CACHE_VERSION = 3
"""2: entries carry their key, a checksum and the sandbox's version; 3: outcomes carry the reference's
seconds per call (the EvalPlus protocol's time limits)."""
BATCH_PROGRAMS = 64
"""Programs per ``run_many`` call; each finished batch is cached at once."""


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _cap(problems: list[Problem], limit: int, seed: int) -> list[Problem]:
    if not limit or len(problems) <= limit:
        return problems
    keep = sorted(random.Random(seed).sample(range(len(problems)), limit))
    return [problems[i] for i in keep]


def _groups(cfg: Config) -> list[tuple[str, str, list[str]]]:
    """(output name, split, sources) per output file."""
    evals = [(f"eval_{name}", "test", [name]) for name in cfg.data.eval_benchmarks]
    return [
        ("train", "train", list(cfg.data.train_sources)),
        ("val", "val", list(cfg.data.val_sources)),
        *evals,
    ]


def _load(cfg: Config, report: dict[str, Any]) -> dict[str, list[tuple[str, Problem]]]:
    """``{set: [(source name, problem), ...]}``; absent sources go to ``report["skipped_sources"]``."""
    data_dir = resolve_data_dir(cfg)
    loaded: dict[str, list[tuple[str, Problem]]] = {}
    for group, split, sources in _groups(cfg):
        loaded[group] = []
        if "kodcode" in sources:
            import datasets

            datasets.disable_progress_bars()
        for name in sources:
            try:
                problems = load_source(name, split, cfg, data_dir)
            except SourceUnavailable as exc:
                report["skipped_sources"][f"{group}/{name}"] = str(exc)
                continue
            problems = _cap(problems, cfg.data.max_problems_per_source, cfg.data.seed)
            report["sources"][f"{group}/{name}"] = {"loaded": len(problems)}
            loaded[group] += [(name, p) for p in problems]
    return loaded


# --------------------------------------------------------------------------------------------------
# Reference runs, content-addressed cache
# --------------------------------------------------------------------------------------------------


def _reference_executor(cfg: Config) -> Any:
    from sandbox import SandboxUnavailable, make_executor

    timeout_s = cfg.data.reference_call_timeout_s
    sandbox_cfg = dataclasses.replace(
        cfg.sandbox,
        call_timeout_s=timeout_s,
        program_cap_s=max(cfg.sandbox.program_cap_s, 20 * timeout_s),
        memory_mb=cfg.data.reference_memory_mb,
    )
    try:
        return make_executor(sandbox_cfg)
    except SandboxUnavailable as exc:
        raise UserError(f"prepare: sandbox unavailable: {exc}") from None


def sandbox_version() -> str:
    """sha256 (16 hex) of the sandbox package's sources: what executed the cached reference programs."""
    import sandbox

    digest = hashlib.sha256()
    for path in sorted(Path(sandbox.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_key(cfg: Config, program: str, exprs: list[str], sandbox: str) -> str:
    """What produced an entry: the reference program, its expressions, the limits and the sandbox version."""
    limits = [cfg.data.reference_call_timeout_s, cfg.data.reference_memory_mb]
    blob = json.dumps([CACHE_VERSION, sandbox, limits, program, exprs], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _rows_sha256(rows: list) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def _to_json(outcomes: list[CallOutcome], key: str) -> bytes:
    rows = [
        [o.status, base64.b64encode(encode(o.value)).decode() if o.ok else None, o.error, o.duration_s]
        for o in outcomes
    ]
    return json.dumps({"key": key, "outcomes": rows, "sha256": _rows_sha256(rows)}).encode()


def _from_json(path: Path, key: str) -> tuple[list[CallOutcome] | None, str]:
    """The entry's outcomes, or None and why not ("" when simply absent): its key and checksum must match."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    try:
        rows = data["outcomes"]
        if data.get("key") != key:
            return None, "its key does not match its name (copied or renamed)"
        if data.get("sha256") != _rows_sha256(rows):
            return None, "sha256 differs from its content (edited or corrupted)"
        return [
            CallOutcome(s, decode(base64.b64decode(v)) if s == "ok" else None, e, float(t))
            for s, v, e, t in rows
        ], ""
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"malformed ({type(exc).__name__})"


def _run_references(
    cfg: Config, problems: list[Problem], cache_dir: Path, report: dict
) -> list[list[CallOutcome]]:
    """Outcomes of :func:`reference_exprs` per problem, from the cache or the sandbox."""
    chunks: list[tuple[int, str, list[str], Path]] = []
    sandbox = sandbox_version()
    for i, p in enumerate(problems):
        for part in chunk_exprs(reference_exprs(p)):
            chunks.append(
                (
                    i,
                    p.reference_solution,
                    part,
                    cache_dir / f"{_cache_key(cfg, p.reference_solution, part, sandbox)}.json",
                )
            )
    results: dict[int, list[CallOutcome]] = {}
    missing = []
    bad: list[str] = []
    for k, (_, _, _, path) in enumerate(chunks):
        cached, why = _from_json(path, path.stem)
        if cached is None:
            missing.append(k)
            bad += [f"{path}: {why}"] if why else []
        else:
            results[k] = cached
    if bad:
        log.warning(
            "prepare: %d cache entries failed their check and are recomputed (first: %s)", len(bad), bad[0]
        )
    report["cache_hits"], report["sandbox_programs"] = len(chunks) - len(missing), len(missing)
    if missing:
        executor = _reference_executor(cfg)
        try:
            for start in range(
                0, len(missing), BATCH_PROGRAMS
            ):  # cache each batch: an interrupted run resumes
                batch = missing[start : start + BATCH_PROGRAMS]
                jobs = [(chunks[k][1], chunks[k][2]) for k in batch]
                names = [problems[chunks[k][0]].id for k in batch]
                ran = run_reference_jobs(executor, jobs, names)
                for k, out in zip(batch, ran, strict=True):
                    write_bytes_atomic(chunks[k][3], _to_json(out, chunks[k][3].stem))
                    results[k] = out
                log.info(
                    "reference programs: %d/%d done", min(start + BATCH_PROGRAMS, len(missing)), len(missing)
                )
        finally:
            executor.close()
    per_problem: list[list[CallOutcome]] = [[] for _ in problems]
    for k, (i, _, _, _) in enumerate(chunks):
        per_problem[i] += results[k]
    return per_problem


def run_reference_jobs(
    executor: Any, jobs: list[tuple[str, list[str]]], names: list[str]
) -> list[list[CallOutcome]]:
    """Run reference chunks, then each :func:`~codea1_core.data.prepared.rerun_alone` call in a program of
    its own (its outcome replaces the chunk's): which inputs survive never depends on the chunking.
    D4: any infrastructure failure aborts (limit 0), never a score, never cached."""
    ran = run_jobs(
        executor, jobs, 0.0, "prepare: reference programs", names=names, limit_key="prepare's limit"
    )
    again = [
        (j, i) for j, (job, out) in enumerate(zip(jobs, ran, strict=True)) for i in rerun_alone(job[1], out)
    ]
    if again:
        alone = run_jobs(
            executor,
            [(jobs[j][0], [jobs[j][1][i]]) for j, i in again],
            0.0,
            "prepare: reference calls alone",
            names=[names[j] for j, _ in again],
            limit_key="prepare's limit",
        )
        ran = [list(out) for out in ran]
        for (j, i), out in zip(again, alone, strict=True):
            ran[j][i] = out[0]
    return ran


# --------------------------------------------------------------------------------------------------
# Verification, gating, outputs
# --------------------------------------------------------------------------------------------------


def _verify(
    cfg: Config, group: str, problems: list[tuple[str, Problem]], outcomes: list, report: dict
) -> list[Problem]:
    kept, seen = [], set()
    for (name, p), out in zip(problems, outcomes, strict=True):
        stats = report["sources"][f"{group}/{name}"]
        filled, excluded = resolve(p, out, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)
        for e in excluded:
            report["excluded_test_reasons"][e["reason"]] += 1
        if excluded:
            report["excluded_tests"][p.id] = excluded[:20]
        if p.metadata.get("skipped_tests"):  # dataset asserts the loader could not turn into calls
            report["skipped_asserts"][p.id] = p.metadata["skipped_tests"][:20]
        stats["excluded_tests"] = stats.get("excluded_tests", 0) + len(excluded)
        reason = ""
        if p.id in seen:
            reason = "duplicate id in this set"
        elif not filled.tests:
            why = Counter(e["reason"] for e in excluded) + Counter(
                s["reason"] for s in p.metadata.get("skipped_tests", [])
            )
            reason = "no golden tests left" + (f" ({dict(why.most_common(3))})" if why else "")
        if reason:
            report["rejected"].append({"id": p.id, "set": group, "reason": reason})
            stats["rejected"] = stats.get("rejected", 0) + 1
            continue
        seen.add(p.id)
        stats["kept"] = stats.get("kept", 0) + 1
        kept.append(filled)
    return kept


def _summary(report: dict[str, Any]) -> None:
    print(f"\n{'set/source':<36}{'loaded':>8}{'kept':>8}{'rejected':>10}{'excl. tests':>13}")
    for key, s in report["sources"].items():
        print(
            f"{key:<36}{s['loaded']:>8}{s.get('kept', 0):>8}{s.get('rejected', 0):>10}{s.get('excluded_tests', 0):>13}"
        )
    for key, why in report["skipped_sources"].items():
        print(f"{key:<36} skipped: {why}")
    print(
        f"sandbox programs run: {report['sandbox_programs']} (cache hits: {report['cache_hits']}); "
        f"report: {report['report_path']}"
    )


@flow(name="prepare", flow_run_name=flow_run_name)
def prepare_flow(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """Prefect entry point (DVC stage and CLI): :func:`prepare` with a params file + ``key=value`` overrides."""
    return prepare(flow_config(params, overrides))


RUN_FIELDS = ("seconds", "sandbox_programs", "cache_hits")
"""Report fields that differ between runs of the same inputs: kept out of the DVC-tracked ``report.json``."""


def prepare(cfg: Config) -> dict[str, Any]:
    """Load, verify, gate and write the prepared sets; returns the report (also ``report.json``)."""
    from tasks.quality import validate_problems

    t0 = time.monotonic()
    out_dir = Path(cfg.data.prepared_dir)
    report: dict[str, Any] = {
        "sources": {},
        "skipped_sources": {},
        "rejected": [],
        "excluded_tests": {},
        "skipped_asserts": {},
        "excluded_test_reasons": Counter(),
        "outputs": {},
    }
    loaded = _load(cfg, report)
    if not loaded["train"]:
        raise DatasetError(
            f"no training problems: every train source was skipped ({report['skipped_sources']})"
        )
    flat = [p for problems in loaded.values() for _, p in problems]
    outcomes = iter(_run_references(cfg, flat, out_dir.parent / "cache" / "expected", report))
    final = {
        group: _verify(cfg, group, problems, [next(outcomes) for _ in problems], report)
        for group, problems in loaded.items()
    }
    for group, problems in final.items():  # (stage_task passes them quote-d: Prefect does not walk the tests)
        if problems:
            stage_task(validate_problems, problems, out_dir / "quality" / f"{group}.json")
        report["outputs"][group] = {
            "problems": len(problems),
            "tests": sum(len(p.tests) for p in problems),
            "plus_tests": sum(len(p.plus_tests) for p in problems),
        }
    for group, problems in final.items():  # write only after every set passed
        if group in ("train", "val") or problems:
            save_prepared(problems, out_dir / f"{group}.parquet", prepared_record(cfg, group))
        else:  # a skipped benchmark must not leave a stale file behind
            (out_dir / f"{group}.parquet").unlink(missing_ok=True)
    report["seconds"] = round(time.monotonic() - t0, 2)
    report["report_path"] = str(out_dir / "report.json")
    tracked = {key: value for key, value in report.items() if key not in RUN_FIELDS}
    write_bytes_atomic(
        out_dir / "report.json", json.dumps(tracked, indent=1, sort_keys=True, default=str).encode()
    )
    run_stats = {key: report[key] for key in RUN_FIELDS}
    write_bytes_atomic(
        out_dir.parent / "cache" / "prepare_run.json", json.dumps(run_stats, indent=1).encode()
    )
    _summary(report)
    return report


def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """Run the prepare flow; data mistakes become one-line :class:`UserError`."""
    from gates.errors import DataQualityError

    try:
        return prepare_flow(params=params, overrides=list(overrides or []))
    except (DatasetError, DataQualityError) as exc:
        raise UserError(f"prepare: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.prepare [--params FILE] [key=value ...]``."""
    return stage_main(
        run, "prepare: verified problem sets for train/val/eval", argv, checks=stage_checks("prepare")
    )


if __name__ == "__main__":
    raise SystemExit(main())
