"""Printed at the end of ``make run``: the headline numbers and where to look at the results.

What it does: reads only files the pipeline wrote (``outputs/``) and prints the learning table — every rate
the evaluate stage measured for both the warm start and the trained models (``warmstart/<key>``,
``<key>``, ``delta/<key>``; Code LLM pass@1 per benchmark and subset, Test LLM validity pass@k and mut@k),
the promotion metric first — then the other evaluation numbers, the registry decision and where to look.
What it does not: compute anything or fail the run — a missing piece is reported as missing.

How to run: ``python -m flows.summary [params.yaml]`` (the last step of ``make run``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from codea1_core.config import ConfigError, load_config


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _headline_keys(metrics: dict[str, Any], promote: str) -> list[str]:
    """Keys with a warm-start and a delta value worth a line: code pass@1, test pass@k / mut@k."""
    keys = []
    for key in metrics:
        if not key.startswith("delta/"):
            continue
        base = key[len("delta/") :]
        last = base.rsplit("/", 1)[-1]
        code = base.startswith("code/") and base.count("/") == 2 and last == "pass@1"
        test = base.startswith("test/") and last.startswith(("pass@", "mut@")) and not last.endswith("_ult")
        if base == promote or code or test:
            keys.append(base)
    return sorted(keys, key=lambda k: (k != promote, not k.startswith("code/"), k))


HEADLINE_FILE = "headline.json"
"""The learning table's numbers (``<eval.out_dir>/headline.json``): the only DVC ``metrics`` file, so
``dvc metrics show`` / ``dvc exp show`` stay a few columns wide (the full ``metrics.json`` is versioned beside it:
``dvc metrics diff outputs/eval/metrics.json``)."""


def headline(metrics: dict[str, Any], promote: str) -> dict[str, dict[str, float]]:
    """``{row: {warmstart, trained, delta}}`` for the promote metric and the first test source's pass@k / mut@k.

    Short names keep ``dvc metrics show`` about 150 columns wide: rows ``code`` (the Code LLM on
    ``eval.promote_metric``, pass@1), ``test`` (the Test LLM's validity pass@k), ``mut`` (its mutant kill rate
    mut@k, the README's) and ``mut_all`` (mut@k_all: over all suites), columns ``warm`` (the warm start),
    ``trained`` and ``delta``. Without a warm-start baseline the rows hold only ``trained``.
    """
    rows: dict[str, dict[str, float]] = {}
    test_keys = [k for k in _headline_keys(metrics, promote) if k.startswith("test/")]
    if not test_keys:  # no baseline: the trained numbers alone
        test_keys = sorted(k for k in metrics if _is_test_rate(k))
    first_source = test_keys[0].split("/")[1] if test_keys else None
    chosen = [("code", promote)]
    chosen += [(_row_label(k), k) for k in test_keys if k.split("/")[1] == first_source]
    for label, key in chosen:
        row = {
            name: float(metrics[full])
            for name, full in (("warm", f"warmstart/{key}"), ("trained", key), ("delta", f"delta/{key}"))
            if isinstance(metrics.get(full), (int, float))
        }
        if row:
            rows[label] = row
    return rows


def _row_label(key: str) -> str:
    """``test`` for validity ``pass@k``, ``mut`` for ``mut@k``, ``mut_all`` for ``mut@k_all`` (each its own row)."""
    last = key.rsplit("/", 1)[-1]
    if last.startswith("mut@"):
        return "mut_all" if last.endswith("_all") else "mut"
    return "test"


def _is_test_rate(key: str) -> bool:
    last = key.rsplit("/", 1)[-1]
    return (
        key.startswith("test/")
        and key.count("/") == 2
        and last.startswith(("pass@", "mut@"))
        and not last.endswith("_ult")
    )


def learning_markdown(metrics: dict[str, Any], promote: str, title: str = "codea1: learning table") -> str:
    """The learning table as markdown (the Prefect run's artifact): warm start -> trained -> delta per rate,
    or the trained numbers alone when the warm start was not evaluated."""
    keys = _headline_keys(metrics, promote)
    lines = [f"# {title}", ""]
    if keys:
        lines += ["| metric | warm start | trained | delta |", "|---|---|---|---|"]
        for key in keys:
            mark = " (promote metric)" if key == promote else ""
            before, after, delta = metrics.get(f"warmstart/{key}"), metrics.get(key), metrics[f"delta/{key}"]
            lines.append(f"| `{key}`{mark} | {_fmt(before)} | {_fmt(after)} | {delta:+.1f} |")
    else:
        lines += ["| metric | trained |", "|---|---|"]
        rates = sorted(k for k in metrics if k == promote or _is_test_rate(k) or k.endswith("/pass@1"))
        lines += [f"| `{k}` | {_fmt(metrics[k])} |" for k in rates if isinstance(metrics[k], (int, float))]
        lines += ["", "(no warm-start baseline: eval.baseline off or no local warm start)"]
    lines += [
        "",
        "Percent; same evaluation protocol and seeds for both columns. Every number: `metrics.json`.",
    ]
    return "\n".join(lines) + "\n"


def print_learning(metrics: dict[str, Any], promote: str) -> None:
    """The warm start -> trained table (same evaluation protocol and seeds for both)."""
    keys = _headline_keys(metrics, promote)
    if not keys:
        print(
            "learning:   no warm-start baseline in outputs/eval/metrics.json (eval.baseline off or no warm start)"
        )
        return
    print("learning (warm start -> trained, same evaluation protocol and seeds; percent):")
    for key in keys:
        mark = "  <- promote metric" if key == promote else ""
        before, after, delta = metrics.get(f"warmstart/{key}"), metrics.get(key), metrics[f"delta/{key}"]
        print(f"  {key:42s} {_fmt(before):>7s} -> {_fmt(after):>7s}  ({delta:+.1f}){mark}")
    print("  (*_seen: new parameters of training families; *_unseen: families never trained on)")


def main(params: str = "params.yaml") -> int:
    try:
        cfg = load_config(params)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    train_dir = Path(cfg.orchestration.checkpoint_dir)
    eval_metrics = _read_json(Path("outputs/eval/metrics.json"))
    train_summary = _read_json(train_dir / "metrics.json")  # the last training iteration (train stage)
    register = _read_json(Path("outputs/register.json"))

    print("\n=== codea1: results ===")
    if train_summary:
        keys = sorted(k for k in train_summary if isinstance(train_summary[k], (int, float, str)))
        print("training:   " + ", ".join(f"{k}={_fmt(train_summary[k])}" for k in keys[:12]))
    if eval_metrics:
        print_learning(eval_metrics, cfg.eval.promote_metric)
        print("evaluation (trained models; warmstart/ and delta/ keys in outputs/eval/metrics.json):")
        for key in sorted(eval_metrics):
            if key.startswith(("warmstart/", "delta/")):
                continue
            if isinstance(eval_metrics[key], (int, float)):
                print(f"  {key:48s} {_fmt(eval_metrics[key])}")
    else:
        print("evaluation: outputs/eval/metrics.json not found")
    if register:
        print(
            "registry:   "
            + ", ".join(f"{k}={_fmt(v)}" for k, v in register.items() if not isinstance(v, dict))
        )
    from tracking.results import MLFLOW_UI, MLFLOW_UI_VIEW

    print("\nWhere to look:")
    print(
        f"  MLflow runs + registry : make ui -> {MLFLOW_UI}/#/experiments{MLFLOW_UI_VIEW}"
        f"  (store: {cfg.tracking.tracking_uri})"
    )
    print("  registered models      : codea1-code, codea1-test (aliases: champion / candidate)")
    print("  DVC metrics and plots  : .venv/bin/dvc metrics show ; .venv/bin/dvc plots show")
    print("  HTML report            : outputs/eval/report.html")
    print(f"  checkpoints + book     : {train_dir}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:2]))
