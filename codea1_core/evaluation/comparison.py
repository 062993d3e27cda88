"""The lab comparison's numbers: per-mode aggregates over seeds, the table, the plots and the HTML report.

What it does: the pure half of ``make lab-compare`` (``tools/lab_compare.py``, docs/method.md §14, §15, D10):
the comparison arms (:data:`MODES`, as ``key=value`` config overrides), one :class:`RunResult` per
experiment, :func:`aggregate` (mean, sample std and 95 % CI over seeds per mode and column), :func:`paired`
(each arm minus ``golden_sparse`` seed by seed), :func:`table_markdown` (aggregate, paired and per-seed
tables), the reward and Mistake-Book charts (PNG bytes, matplotlib Agg) and a self-contained HTML page.
What it does not: run experiments, read DVC/git, or write files (the flow does).

How to run: ``pytest tests/tools/test_lab_compare.py``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

SPARSE = "lab.golden_tests=sparse"
"""The data every learning arm trains on: scarce golden tests, as in real datasets (the paper's premise)."""
MODES: dict[str, list[str]] = {
    "golden_sparse": ["mode=golden", SPARSE],
    "golden_boundary": ["mode=golden", "lab.golden_tests=boundary"],
    "selfplay": ["mode=selfplay", SPARSE],
    "codea1": ["mode=codea1", SPARSE],
    "codea1_nomb": ["mode=codea1", "mistake_book.enabled=false", SPARSE],
    "codea1_a0": ["mode=codea1", "reward.alpha=0.0", SPARSE],
    "codea1_a1": ["mode=codea1", "reward.alpha=1.0", SPARSE],
    "codea1_boundary": ["mode=codea1", "lab.golden_tests=boundary"],
}
"""Comparison arms (D10, §15) as ``-S`` overrides. Every arm but ``golden_boundary`` (the oracle ceiling:
exhaustive boundary tests) and ``codea1_boundary`` sees the sparse golden tests wherever training uses golden
tests (golden rewards, validation, the Test LLM's warm-start suites); evaluation is the same full set for all.
``codea1_nomb`` is the §15.4 Mistake Book ablation, ``codea1_a0`` / ``codea1_a1`` the α ablation (§15.3).
``codea1`` is also the default ``make run`` (``params.yaml`` as shipped; ``tests/tools/test_lab_compare.py`` keeps
the two equal), so its seed 1 is the run the README's learning numbers come from. ``codea1_boundary`` is what
picked that default: the same method with the boundary tests in the Test LLM's warm-start suites and
validation (the 5-seed comparison, docs/results.md, chose sparse over it)."""
BASELINE_ARM = "golden_sparse"
"""The arm every other one is compared with seed by seed (:func:`paired`): the paper's Golden-Tests row."""
MODE_COLORS = {
    "golden_sparse": "tab:green",
    "golden_boundary": "tab:olive",
    "selfplay": "tab:orange",
    "codea1": "tab:blue",
    "codea1_nomb": "tab:red",
    "codea1_a0": "tab:cyan",
    "codea1_a1": "tab:purple",
    "codea1_boundary": "tab:gray",
}
"""One colour per mode in every chart."""
COLUMNS: list[tuple[str, str, str]] = [
    ("warm start code pass@1", "eval", "warmstart/code/lab_heldout_seen/base/pass@1"),
    ("code pass@1 held-out seen", "eval", "code/lab_heldout_seen/base/pass@1"),
    ("Δ vs warm start", "eval", "delta/code/lab_heldout_seen/base/pass@1"),
    ("code pass@1 held-out all", "eval", "code/lab_heldout/base/pass@1"),
    ("sparse-test pass@1 seen", "eval", "code/lab_heldout_seen/sparse/pass@1"),
    ("test pass@5", "eval", "test/lab_heldout/pass@5"),
    ("Δ test pass@5", "eval", "delta/test/lab_heldout/pass@5"),
    ("mut@5", "eval", "test/lab_heldout/mut@5"),
    ("mut@5 suites", "eval", "test/lab_heldout/mut_suites"),
    ("mut@5 all suites", "eval", "test/lab_heldout/mut@5_all"),
    ("Mul", "eval", "test/lab_heldout/mul"),
    ("final code reward", "history", "code/reward_mean"),
    ("final test reward", "history", "test/reward_mean"),
]
"""(column title, source, key): the paper's Table 15.1/15.2 in small, the starting point each mode improved
on (every mode has its own warm start: selfplay's one model learned both roles), the final training rewards.
``base`` pass@1 is judged on the full boundary set; "sparse-test" on the sparse golden tests only (a gap
between them is bugs the sparse tests let through); mut@5 over passing suites (and how many), and over all."""
HEADLINE = "code pass@1 held-out seen"
"""The column the paired comparison and the per-seed table are about (``eval.promote_metric``)."""


@dataclass(frozen=True)
class Experiment:
    """One planned DVC experiment."""

    name: str
    mode: str
    seed: int
    overrides: tuple[str, ...]


@dataclass
class RunResult:
    """What one experiment produced (empty dicts when it failed or a file was missing)."""

    experiment: Experiment
    metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    run: dict[str, Any] = field(default_factory=dict)
    """How it ran, when recorded (``run.json`` beside its results): ``wall_s``, ``load_before``, ``commit``."""


def parse_history(text: str) -> list[dict[str, Any]]:
    """``history.csv`` rows with numbers as floats (empty cells dropped)."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, Any] = {}
        for key, value in raw.items():
            if value in ("", None):
                continue
            try:
                row[key] = float(value)
            except ValueError:
                row[key] = value
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# Aggregate (pure)
# ------------------------------------------------------------------------------------------------


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def final_value(history: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The last finite value of ``key`` in the history, or None."""
    vals = [float(row[key]) for row in history if _num(row.get(key))]
    return vals[-1] if vals else None


def row_values(result: RunResult) -> dict[str, float | None]:
    """One experiment's value per table column (None when missing)."""
    out: dict[str, float | None] = {}
    for title, source, key in COLUMNS:
        if source == "eval":
            value = result.metrics.get(key)
            out[title] = float(value) if _num(value) else None
        else:
            out[title] = final_value(result.history, key)
    return out


_T975: tuple[float, ...]
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145)
_T975 += (2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048)
_T975 += (2.045, 2.042)
"""Student-t 0.975 quantiles for 1..30 degrees of freedom (beyond: the normal 1.96)."""


def ci95(values: Sequence[float]) -> float | None:
    """Half-width of the two-sided 95 % confidence interval of the mean (Student t, n - 1 df).

    Few seeds make it wide on purpose (t = 2.776 for 5 seeds): that width is what the comparison knows.
    None when n < 2.
    """
    n = len(values)
    if n < 2:
        return None
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    return t * statistics.stdev(values) / math.sqrt(n)


def _summary(vals: Sequence[float]) -> dict[str, Any]:
    return {
        "values": list(vals),
        "n": len(vals),
        "mean": statistics.fmean(vals) if vals else None,
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "ci95": ci95(vals),
    }


def aggregate(results: Sequence[RunResult]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per mode and column: ``{mean, std, ci95, n, values}``; std is the sample std (None when n < 2)."""
    values: dict[str, dict[str, list[float]]] = {}
    for res in results:
        if res.error:
            continue
        cells = values.setdefault(res.experiment.mode, {t: [] for t, _, _ in COLUMNS})
        for title, value in row_values(res).items():
            if value is not None:
                cells[title].append(value)
    return {mode: {t: _summary(v) for t, v in cells.items()} for mode, cells in values.items()}


def paired(
    results: Sequence[RunResult], mode: str, baseline: str = BASELINE_ARM, column: str = HEADLINE
) -> dict[str, Any]:
    """``mode`` minus ``baseline`` on ``column``, seed by seed (seeds where both produced the value).

    Pairing removes what a seed shares across arms (its problems' order, its warm start's luck), so the
    deltas' CI is the honest test of "beats the baseline"; ``wins`` counts seeds with a positive delta.
    """
    by_seed: dict[str, dict[int, float]] = {mode: {}, baseline: {}}
    for res in results:
        arm = res.experiment.mode
        value = None if res.error else row_values(res)[column]
        if arm in by_seed and value is not None:
            by_seed[arm][res.experiment.seed] = value
    seeds = sorted(set(by_seed[mode]) & set(by_seed[baseline]))
    deltas = [by_seed[mode][s] - by_seed[baseline][s] for s in seeds]
    return {"seeds": seeds, "deltas": deltas, "wins": sum(d > 0 for d in deltas), **_summary(deltas)}


def _fmt(value: float | None, half: float | None = None, signed: bool = False) -> str:
    if value is None:
        return "–"
    text = f"{value:+.2f}" if signed else f"{value:.2f}"
    return f"{text} ± {half:.2f}" if half is not None else text


def _cell(cell: Mapping[str, Any]) -> str:
    return _fmt(cell["mean"], cell["ci95"])


def table_markdown(table: Mapping[str, Mapping[str, Mapping[str, Any]]], results: Sequence[RunResult]) -> str:
    """Markdown: one row per mode (``mean ± 95 % CI half-width``), the paired deltas vs
    :data:`BASELINE_ARM` per seed, the per-seed headline numbers, and the failed experiments."""
    titles = [t for t, _, _ in COLUMNS]
    lines = ["| mode | seeds | " + " | ".join(titles) + " |", "|---" * (len(titles) + 2) + "|"]
    for mode in [m for m in MODES if m in table]:
        n = max(c["n"] for c in table[mode].values())
        lines.append(f"| {mode} | {n} | " + " | ".join(_cell(table[mode][t]) for t in titles) + " |")
    lines += ["", "mean ± half-width of the 95 % confidence interval over seeds (Student t, n − 1 df)."]
    lines += _paired_lines(results) + _per_seed_lines(results)
    failed = [r for r in results if r.error]
    if failed:
        lines.append("")
        lines.extend(f"- FAILED {r.experiment.name}: {r.error}" for r in failed)
    return "\n".join(lines) + "\n"


def _paired_lines(results: Sequence[RunResult]) -> list[str]:
    """Paired deltas of every other arm vs the baseline arm, when the baseline ran."""
    ran = {r.experiment.mode for r in results if not r.error}
    arms = [m for m in MODES if m != BASELINE_ARM and m in ran]
    if BASELINE_ARM not in ran or not arms:
        return []
    lines = ["", f"Paired vs {BASELINE_ARM} ({HEADLINE}, per seed: arm − {BASELINE_ARM}):", ""]
    lines += ["| mode | seeds | Δ per seed | mean Δ ± 95 % CI | wins |", "|---|---|---|---|---|"]
    for arm in arms:
        p = paired(results, arm)
        per_seed = ", ".join(f"s{s}: {d:+.2f}" for s, d in zip(p["seeds"], p["deltas"], strict=True))
        mean = _fmt(p["mean"], p["ci95"], signed=True)
        lines.append(f"| {arm} | {p['n']} | {per_seed or '–'} | {mean} | {p['wins']}/{p['n']} |")
    return lines


def _per_seed_lines(results: Sequence[RunResult]) -> list[str]:
    """Warm start and trained headline per (mode, seed): a spread hidden by a mean shows here."""
    order = {m: i for i, m in enumerate(MODES)}
    rows = sorted(
        (r for r in results if not r.error),
        key=lambda r: (r.experiment.seed, order.get(r.experiment.mode, len(order)), r.experiment.mode),
    )
    if not rows:
        return []
    start = COLUMNS[0][0]
    lines = ["", f"Per seed ({start} → {HEADLINE}):", ""]
    lines += ["| mode | seed | warm start | trained | Δ |", "|---|---|---|---|---|"]
    for res in rows:
        v = row_values(res)
        trained, warm = v[HEADLINE], v[start]
        delta = trained - warm if trained is not None and warm is not None else None
        lines.append(
            f"| {res.experiment.mode} | {res.experiment.seed} | {_fmt(v[start])} | {_fmt(v[HEADLINE])} "
            f"| {_fmt(delta, signed=True)} |"
        )
    return lines


# ------------------------------------------------------------------------------------------------
# Plots and report
# ------------------------------------------------------------------------------------------------

PAPER_PASS_RATE = {"codea1": 0.76, "codea1_nomb": 0.86, "golden_sparse": 0.74, "replay": 0.55}
"""§15.4 (fig:mistakebook, approximate): training pass rate at the end of training; replay pass rate."""


def mean_curve(
    results: Sequence[RunResult], mode: str, keys: Sequence[str]
) -> tuple[list[float], list[float]]:
    """Mean over seeds of the first present key per iteration (iterations where any seed has a value)."""
    by_it: dict[float, list[float]] = {}
    for res in results:
        if res.experiment.mode != mode or res.error:
            continue
        for i, row in enumerate(res.history):
            value = next((row[k] for k in keys if _num(row.get(k))), None)
            if value is not None:
                it = float(row["iteration"]) if _num(row.get("iteration")) else float(i)
                by_it.setdefault(it, []).append(float(value))
    xs = sorted(by_it)
    return xs, [statistics.fmean(by_it[x]) for x in xs]


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def rewards_chart(results: Sequence[RunResult]) -> bytes:
    """Code and test reward per iteration, one line per mode (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, key in zip(axes, ("code/reward_mean", "test/reward_mean"), strict=True):
        for mode in MODES:
            xs, ys = mean_curve(results, mode, [key])
            if xs:
                ax.plot(xs, ys, marker=".", label=mode, color=MODE_COLORS[mode])
        ax.set(title=f"{key} (mean over seeds)", xlabel="iteration", ylabel="reward")
        ax.legend(fontsize=8)
    return _png(fig)


def mistake_book_chart(results: Sequence[RunResult]) -> bytes:
    """codea1's Mistake Book added/removed per iteration; training pass rates vs the paper's §15.4 figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"wspace": 0.35})
    for key, color in (("mistake_book/added", "tab:green"), ("mistake_book/removed", "tab:red")):
        xs, ys = mean_curve(results, "codea1", [key])
        if xs:
            left.plot(xs, ys, marker=".", label=key, color=color)
    left.set(title="codea1: Mistake Book (mean over seeds)", xlabel="iteration", ylabel="tests per iteration")
    xs, ys = mean_curve(results, "codea1", ["mistake_book/size"])
    if xs:  # the size grows 100x larger than the per-iteration flows: its own axis
        size_ax = left.twinx()
        size_ax.plot(xs, ys, ls="--", color="tab:gray", label="mistake_book/size (right)")
        size_ax.set_ylabel("tests in the book")
        size_ax.legend(fontsize=7, loc="lower right")
    left.legend(fontsize=7, loc="upper left")
    lines = [
        (m, ["code/pass_new", "code/pass_golden", "code/reward_mean"]) for m in ("codea1", "codea1_nomb")
    ]
    lines += [("golden_sparse", ["code/pass_golden", "code/pass_new", "code/reward_mean"])]
    for mode, keys in lines:
        xs, ys = mean_curve(results, mode, keys)
        if xs:
            right.plot(xs, ys, marker=".", label=f"{mode} pass rate", color=MODE_COLORS[mode])
            right.axhline(PAPER_PASS_RATE[mode], ls="--", lw=0.8, color=MODE_COLORS[mode])
    xs, ys = mean_curve(results, "codea1", ["mistake_book/replay_pass_rate"])
    if xs:
        right.plot(xs, ys, marker="x", label="codea1 replay pass rate", color="tab:brown")
        right.axhline(PAPER_PASS_RATE["replay"], ls="--", lw=0.8, color="tab:brown")
    right.set(title="training pass rate (dashed: paper §15.4)", xlabel="iteration", ylim=(0, 1.05))
    right.legend(fontsize=7)
    return _png(fig)


def report_html(table_md: str, charts: Mapping[str, bytes], results: Sequence[RunResult], notes: str) -> str:
    """One self-contained HTML page: the table, the plots, every experiment's metrics side by side."""
    import base64
    import html

    from codea1_core.evaluation.report import comparison_table

    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>codea1 lab compare</title>"]
    parts.append("<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:2px 6px}")
    parts.append("table{border-collapse:collapse}</style></head><body><h1>codea1 lab compare</h1>")
    parts.append(f"<p>{html.escape(notes)}</p><pre>{html.escape(table_md)}</pre>")
    for name, png in charts.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{html.escape(name)}</h2><img alt='{name}' src='data:image/png;base64,{data}'/>")
    runs = {r.experiment.name: r.metrics for r in results if not r.error}
    if runs:
        parts.append("<h2>All experiments</h2>" + comparison_table(runs))
    parts.append("</body></html>")
    return "\n".join(parts)
