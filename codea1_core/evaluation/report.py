"""Self-contained HTML evaluation report with embedded PNG plots (matplotlib, Agg backend).

What it does: renders flat evaluation metrics (``code/<bench>/plus/pass@1``, ``test/<src>/mul``, ...)
as tables and a bar chart of pass rates per benchmark; training curves (code/test reward means and
Mistake Book tests added/removed per iteration) from the training metrics history; and a comparison
table when several metrics files are given. Plots are PNG bytes embedded as base64 ``data:`` URIs, so
the single HTML file can be mailed or attached to an MLflow run.

What it does not: read or write files (``flows/evaluate.py`` does the I/O), compute metrics.

How to run: ``render_report(metrics, history=rows, runs={"a": m1, "b": m2})`` returns the HTML text;
tests in ``tests/core/evaluation/test_report.py``.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REWARD_KEYS = ("code/reward_mean", "test/reward_mean")
"""Training-history keys plotted as reward curves (written by ``tasks/score.py``)."""
BOOK_ADDED_KEYS = ("mistake_book/added", "book/added", "mb/added")
BOOK_REMOVED_KEYS = ("mistake_book/removed", "book/removed", "mb/removed")
"""Accepted names of the per-iteration Mistake Book counts (the first one present is plotted)."""
ITERATION_KEYS = ("iteration", "step", "progress/iteration")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"/>'


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def pass_rate_rows(metrics: Mapping[str, float]) -> list[tuple[str, str, float]]:
    """``(benchmark, split, pass@1)`` for every ``code/<bench>/<split>/pass@1`` key, sorted."""
    rows = []
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "code" and parts[3] == "pass@1" and _num(value):
            rows.append((parts[1], parts[2], float(value)))
    return sorted(rows)


def pass_rate_chart(metrics: Mapping[str, float]) -> bytes | None:
    """Grouped bars of pass@1 (base / plus) per benchmark; None when there is nothing to plot."""
    rows = pass_rate_rows(metrics)
    if not rows:
        return None
    benches = sorted({b for b, _, _ in rows})
    splits = sorted({s for _, s, _ in rows})
    width = 0.8 / len(splits)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(benches) + 2), 3.2))
    for j, split in enumerate(splits):
        vals = [next((v for b, s, v in rows if b == bench and s == split), 0.0) for bench in benches]
        xs = [i + j * width for i in range(len(benches))]
        bars = ax.bar(xs, vals, width=width, label=split)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([i + width * (len(splits) - 1) / 2 for i in range(len(benches))], benches)
    ax.set_ylim(0, 105)
    ax.set_ylabel("pass@1 (%)")
    ax.set_title("Code LLM pass rate per benchmark")
    ax.legend(fontsize=8)
    return _png(fig)


def _series(
    history: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> tuple[str, list[float], list[float]] | None:
    for key in keys:
        xs, ys = [], []
        for i, row in enumerate(history):
            if _num(row.get(key)):
                it = next((row[k] for k in ITERATION_KEYS if _num(row.get(k))), i)
                xs.append(float(it))
                ys.append(float(row[key]))
        if xs:
            return key, xs, ys
    return None


def training_chart(history: Sequence[Mapping[str, Any]]) -> bytes | None:
    """Reward curves and Mistake Book added/removed per iteration; None when the history has neither."""
    rewards = [s for k in REWARD_KEYS if (s := _series(history, [k]))]
    book = [s for keys in (BOOK_ADDED_KEYS, BOOK_REMOVED_KEYS) if (s := _series(history, keys))]
    if not rewards and not book:
        return None
    panels = [p for p in (rewards, book) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.0), squeeze=False)
    for ax, series, ylabel in zip(axes[0], panels, ["reward" if rewards else "tests", "tests"], strict=False):
        for key, xs, ys in series:
            ax.plot(xs, ys, marker=".", label=key)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0][0].set_title("Training rewards" if rewards else "Mistake Book")
    if len(panels) == 2:
        axes[0][1].set_title("Mistake Book tests added / removed")
    return _png(fig)


def learning_rows(metrics: Mapping[str, Any], promote: str = "") -> list[tuple[str, Any, float, Any]]:
    """``(key, warm start, trained, delta)`` for the learning table: the promote metric, every Code LLM pass@1
    (``code/<bench>/<split>/pass@1``) and Test LLM validity / mutant rate (``test/<src>/pass@k``, ``mut@k``);
    warm start and delta are None without a warm-start baseline (``warmstart/`` and ``delta/`` keys)."""

    def wanted(key: str) -> bool:
        parts = key.split("/")
        code = parts[0] == "code" and len(parts) == 4 and parts[3] == "pass@1"
        test = parts[0] == "test" and len(parts) == 3 and parts[2].startswith(("pass@", "mut@"))
        return key == promote or ((code or test) and not key.endswith("_ult"))

    keys = [k for k in metrics if wanted(k) and _num(metrics[k])]
    keys.sort(key=lambda k: (k != promote, not k.startswith("code/"), k))
    return [(k, metrics.get(f"warmstart/{k}"), float(metrics[k]), metrics.get(f"delta/{k}")) for k in keys]


def learning_table(rows: Sequence[tuple[str, Any, float, Any]], promote: str = "") -> str:
    """The learning table as HTML: warm start -> trained -> delta per rate, the promote metric marked."""
    body = "".join(
        f"<tr><td>{html.escape(k)}{' (promote metric)' if k == promote else ''}</td><td>{_fmt(w)}</td>"
        f"<td>{_fmt(t)}</td><td>{'–' if not _num(d) else f'{d:+.2f}'}</td></tr>"
        for k, w, t, d in rows
    )
    head = "<tr><th>metric (%)</th><th>warm start</th><th>trained</th><th>delta</th></tr>"
    return f"<table>{head}{body}</table>"


def learning_chart(rows: Sequence[tuple[str, Any, float, Any]]) -> bytes | None:
    """One panel per role (Code LLM pass@1, Test LLM pass@k / mut@k): warm start and trained bars."""
    roles = [(r, [row for row in rows if row[0].startswith(f"{r}/")]) for r in ("code", "test")]
    roles = [(r, rs) for r, rs in roles if rs]
    if not roles:
        return None
    fig, axes = plt.subplots(1, len(roles), figsize=(6.0 * len(roles), 3.4), squeeze=False)
    for ax, (role, rs) in zip(axes[0], roles, strict=True):
        labels = ["/".join(k.split("/")[1:]) for k, _, _, _ in rs]
        xs = list(range(len(rs)))
        warm = [float(w) if _num(w) else 0.0 for _, w, _, _ in rs]
        if any(_num(w) for _, w, _, _ in rs):
            ax.bar_label(
                ax.bar([x - 0.2 for x in xs], warm, width=0.4, label="warm start"), fmt="%.1f", fontsize=7
            )
        trained = ax.bar([x + 0.2 for x in xs], [t for _, _, t, _ in rs], width=0.4, label="trained")
        ax.bar_label(trained, fmt="%.1f", fontsize=7)
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.set_title("Code LLM" if role == "code" else "Test LLM")
        ax.legend(fontsize=8)
    return _png(fig)


def context_table(context: Mapping[str, str]) -> str:
    """Run id, commit, links: values starting with ``http`` become links."""
    cells = []
    for key, value in context.items():
        text = html.escape(str(value))
        shown = f'<a href="{text}">{text}</a>' if str(value).startswith("http") else text
        cells.append(f"<tr><th>{html.escape(key)}</th><td>{shown}</td></tr>")
    return f"<table>{''.join(cells)}</table>"


def _fmt(value: Any) -> str:
    if _num(value):
        return f"{value:.2f}"
    return html.escape(str(value)) if value is not None else "–"


def metrics_table(metrics: Mapping[str, Any]) -> str:
    """All metrics as a two-column HTML table, sorted by key."""
    body = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in sorted(metrics.items())
    )
    return f"<table><tr><th>metric</th><th>value</th></tr>{body}</table>"


def comparison_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per metric key present in any run, one column per run; the best numeric cell is bold."""
    names = list(runs)
    keys = sorted({k for m in runs.values() for k in m})
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for key in keys:
        vals = [runs[n].get(key) for n in names]
        nums = [v for v in vals if _num(v)]
        best = max(nums) if len(nums) > 1 and "infra" not in key and "n_" not in key else None
        cells = "".join(
            f"<td>{'<b>' + _fmt(v) + '</b>' if best is not None and v == best else _fmt(v)}</td>"
            for v in vals
        )
        rows.append(f"<tr><td>{html.escape(key)}</td>{cells}</tr>")
    return f"<table><tr><th>metric</th>{head}</tr>{''.join(rows)}</table>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:left}th{background:#eee}"
)


def render_report(
    metrics: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]] | None = None,
    runs: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "codea1 evaluation",
    notes: Sequence[str] = (),
    promote: str = "",
    context: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> str:
    """The complete HTML document (plots embedded, no external resources): the learning table and its chart
    (both roles) first, then the run's context (run id, commit, MLflow links), pass rates, training curves,
    the comparison, the params and every metric."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>")
    rows = learning_rows(metrics, promote)
    if any(_num(warm) for _, warm, _, _ in rows):  # without a warm-start baseline the pass rates below say it
        parts.append("<h2>Learning: warm start → trained</h2>" + learning_table(rows, promote))
        parts.append("<p>Percent; same evaluation protocol and seeds for both columns.</p>")
        learned = learning_chart(rows)
        if learned:
            parts.append(_img(learned, "learning, both roles"))
    if context:
        parts.append("<h2>Run</h2>" + context_table(context))
    parts.extend(f"<p>{html.escape(n)}</p>" for n in notes)
    chart = pass_rate_chart(metrics)
    parts.append("<h2>Pass rates</h2>" + (_img(chart, "pass rates") if chart else "<p>No code metrics.</p>"))
    parts.append("<h2>Training</h2>")
    train = training_chart(history or [])
    parts.append(_img(train, "training curves") if train else "<p>No training metrics history found.</p>")
    if runs and len(runs) > 1:
        parts.append("<h2>Run comparison</h2>" + comparison_table(runs))
    if params:
        parts.append("<details><summary><h2 style='display:inline'>Params</h2></summary>")
        parts.append(metrics_table({k: str(v) for k, v in params.items()}))
        parts.append("</details>")
    parts.append("<h2>All metrics</h2>" + metrics_table(metrics))
    parts.append("</body></html>")
    return "\n".join(parts)
