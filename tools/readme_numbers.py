"""The measured numbers of ``README.md`` and ``docs/results.md``, rewritten from the outputs that state them.

What it does: renders generated blocks, each between its ``<!-- NAME:begin -->`` / ``<!-- NAME:end -->``
markers, from files committed beside the code (:data:`FILES` says which file holds which blocks; a block may
sit in several files and says the same in each):

* ``learning``: the default ``make run``'s warm start → trained table, from ``outputs/eval/metrics.json``
  (versioned by git beside ``dvc.lock``, written by the evaluate stage) and the seed in ``params.yaml``;
* ``seeds``: the default run across seeds (the ``codea1`` arm of ``make lab-compare``, which is ``params.yaml``
  as shipped: ``tests/tools/test_lab_compare.py`` keeps them equal), from
  ``docs/lab_compare/runs/<experiment>/metrics.json``;
* ``lab-compare``: the comparison's tables (``docs/lab_compare/table.md``) with its commit, experiment count and
  wall time (``docs/lab_compare/table.json``).

It either rewrites the blocks (atomically, file by file) or, with ``--check``, exits 1 when any file's block
differs from what the outputs say. ``tests/tools/test_readme_numbers.py`` runs the check, so a commit that changes the
outputs without the documents (or the reverse) fails the suite: the documents' numbers are the ones their commit
regenerates.

What it does not: run anything. Regenerate the outputs with ``make run`` and ``make lab-compare`` (its
results copied into ``docs/lab_compare/``: see ``docs/results.md``), then ``make readme-numbers``.

How to run: ``python -m tools.readme_numbers [--check]``.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from codea1_core.atomic import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- learning:begin -->", "<!-- learning:end -->"
HEADLINE = "code/lab_heldout_seen/base/pass@1"
DEFAULT_ARM = "codea1"
"""The arm of ``make lab-compare`` that is the default ``make run`` (its seed 1 is the learning block's run)."""
LAB_COMPARE = Path("docs") / "lab_compare"
"""Where the committed results of ``make lab-compare`` live (``table.md``, ``table.json``, ``runs/``, plots)."""


def _trio(metrics: dict[str, Any], key: str, delta: bool = True) -> str:
    """``warm → trained (+delta)`` of one metric, one decimal, as the learning table prints them."""
    warm, trained = metrics[f"warmstart/{key}"], metrics[key]
    text = f"{_num(warm)} → {_num(trained)}"
    return f"{text} ({metrics[f'delta/{key}']:+.1f})" if delta else text


def _fill(text: str) -> str:
    """One generated paragraph wrapped like the README's hand-written ones."""
    return textwrap.fill(text, 118, break_on_hyphens=False, break_long_words=False)


def _num(value: float) -> str:
    return f"{value:.1f}".replace(".0", "") if value == int(value) else f"{value:.1f}"


LEARNING_ROWS: list[tuple[str, str]] = [
    ("Code LLM pass@1, training families, new parameters (the headline)", HEADLINE),
    ("Code LLM pass@1, all held-out problems", "code/lab_heldout/base/pass@1"),
    ("Code LLM pass@1, families never trained on", "code/lab_heldout_unseen/base/pass@1"),
    ("Test LLM validity `pass@5`: tests correct on the reference", "test/lab_heldout/pass@5"),
    ("Test LLM kill rate `mut@5`: over the suites that pass the reference", "test/lab_heldout/mut@5"),
    ("Test LLM kill rate `mut@5_all`: over all suites", "test/lab_heldout/mut@5_all"),
]
"""The learning table's rows: (label, metric key); every key has ``warmstart/`` and ``delta/`` twins."""


def render(metrics: dict[str, Any], seed: int) -> str:
    """The learning table for one run's ``metrics.json`` (keys ``warmstart/…``, ``…``, ``delta/…``)."""
    lines = ["| held-out lab problems, % | warm start | trained | Δ |", "|---|---|---|---|"]
    for label, key in LEARNING_ROWS:
        delta = f"{metrics[f'delta/{key}']:+.1f}".replace("+0.0", "0").replace("-0.0", "0")
        if key == HEADLINE:
            delta = f"**{delta}**"
        lines.append(f"| {label} | {_num(metrics[f'warmstart/{key}'])} | {_num(metrics[key])} | {delta} |")
    lines += [
        "",
        f"Seed {seed}, `params.yaml` as shipped; the headline is `{HEADLINE}`. Regenerated from",
        "`outputs/eval/metrics.json` by `make readme-numbers`.",
    ]
    return "\n".join(lines)


def render_seeds(runs: dict[int, dict[str, Any]], commit: str) -> str:
    """The default run across seeds: one row per seed, then the gain's mean and range."""
    lines = [
        _fill(
            f"The default run across seeds — the `{DEFAULT_ARM}` arm of `make lab-compare` (`params.yaml` as "
            f"shipped) at `{commit}`, each seed a full run with `seed` and `data.seed` set; seed 1 is the run above:"
        ),
        "",
        "| seed | headline pass@1, warm start → trained | all held-out pass@1 | test `pass@5` | `mut@5` "
        "(`mut@5_all`) | sparse-test pass@1 |",
        "|---|---|---|---|---|---|",
    ]
    gains = []
    for seed, m in sorted(runs.items()):
        gains.append(m[f"delta/{HEADLINE}"])
        mut = f"{_trio(m, 'test/lab_heldout/mut@5', delta=False)} ({_num(m['test/lab_heldout/mut@5_all'])})"
        lines.append(
            f"| {seed} | {_num(m[f'warmstart/{HEADLINE}'])} → {_num(m[HEADLINE])} (**{gains[-1]:+.1f}**) "
            f"| {_trio(m, 'code/lab_heldout/base/pass@1', delta=False)} "
            f"| {_trio(m, 'test/lab_heldout/pass@5', delta=False)} | {mut} "
            f"| {_trio(m, 'code/lab_heldout_seen/sparse/pass@1', delta=False)} |"
        )
    if gains:
        spread = f", sample std {statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
        warm = [m[f"warmstart/{HEADLINE}"] for _, m in sorted(runs.items())]
        lines += [
            "",
            _fill(
                f"Headline gain over {len(gains)} seeds: mean **{statistics.fmean(gains):+.1f}**, from "
                f"{min(gains):+.1f} to {max(gains):+.1f}{spread}; warm start {' / '.join(_num(w) for w in warm)} "
                f"(lowest / median {min(warm) / statistics.median(warm):.2f}). Regenerated from "
                f"`{LAB_COMPARE.as_posix()}/runs/` by `make readme-numbers`."
            ),
        ]
    return "\n".join(lines)


def render_lab_compare(table: dict[str, Any], table_md: str) -> str:
    """The comparison's header line (commit, experiments, wall time) and its tables."""
    experiments = table.get("experiments", {})
    done = [e for e in experiments.values() if not e.get("error")]
    modes = sorted({e["mode"] for e in experiments.values()})
    seeds = sorted({e["seed"] for e in experiments.values()})
    timed = [e["wall_s"] for e in done if isinstance(e.get("wall_s"), int | float)]
    wall_text = (
        f"{sum(timed) / 3600:.1f} h of wall time summed over the experiments (`run.json` beside each"
        + (")" if len(timed) == len(done) else f"; {len(done) - len(timed)} untimed)")
    )
    commits = ", ".join(f"`{c}`" for c in table.get("commits", [])) or "an unrecorded commit"
    count = (
        f"{len(done)} experiments"
        if len(done) == len(experiments)
        else f"{len(done)} of {len(experiments)} experiments"
    )
    header = (
        f"Measured by `make lab-compare` at {commits}: {count} ({len(modes)} arms × {len(seeds)} seeds), "
        f"{wall_text} on this repo's 2-core machine. Held-out lab problems, n = 8 samples at T = 0.7, pass@k in %. "
        f"Regenerated from `{LAB_COMPARE.as_posix()}/table.md` by `make readme-numbers`."
    )
    return _fill(header) + "\n\n" + table_md.strip()


def _lab_compare_files(repo: Path) -> tuple[dict[str, Any], str]:
    folder = repo / LAB_COMPARE
    return json.loads((folder / "table.json").read_text()), (folder / "table.md").read_text()


def _expected_learning(repo: Path) -> str:
    metrics = json.loads((repo / "outputs" / "eval" / "metrics.json").read_text())
    return render(metrics, int(yaml.safe_load((repo / "params.yaml").read_text())["seed"]))


def _expected_seeds(repo: Path) -> str:
    table, _ = _lab_compare_files(repo)
    runs = {
        int(e["seed"]): json.loads((repo / LAB_COMPARE / "runs" / name / "metrics.json").read_text())
        for name, e in table["experiments"].items()
        if e["mode"] == DEFAULT_ARM and not e.get("error")
    }
    return render_seeds(runs, ", ".join(table.get("commits", [])) or "an unrecorded commit")


def _expected_lab_compare(repo: Path) -> str:
    return render_lab_compare(*_lab_compare_files(repo))


BLOCKS: dict[str, tuple[str, Callable[[Path], str]]] = {
    "learning": ("outputs/eval/metrics.json (run `make run`)", _expected_learning),
    "seeds": (f"{LAB_COMPARE.as_posix()}/runs/ (run `make lab-compare`)", _expected_seeds),
    "lab-compare": (f"{LAB_COMPARE.as_posix()}/table.md (run `make lab-compare`)", _expected_lab_compare),
}
"""Block name -> (its source, for messages; what the block must say for the files committed in a repo)."""


FILES: dict[str, tuple[str, ...]] = {
    "README.md": ("learning",),
    "docs/results.md": ("learning", "seeds", "lab-compare"),
}
"""Which generated blocks each document holds (paths relative to the repository)."""


def _span(text: str, path: Path, name: str) -> tuple[int, int]:
    """Offsets of the text between a block's markers; a clear error when they are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    match = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), text, flags=re.S)
    if match is None:
        raise SystemExit(f"{path}: the markers {begin} / {end} are missing")
    return match.start(1), match.end(1)


def expected(repo: Path = REPO, name: str = "learning") -> str:
    """What the block ``name`` must say for the files committed in ``repo``."""
    source, render_block = BLOCKS[name]
    try:
        return render_block(repo)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"generated block {name!r}: cannot render it from {source}: {type(exc).__name__}: {exc}"
        ) from None


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    wants: dict[str, str] = {}
    stale: list[tuple[str, str]] = []  # (file, block)
    rewritten: dict[Path, str] = {}
    for rel, names in FILES.items():
        path = repo / rel
        try:
            text = path.read_text()
        except OSError as exc:
            raise SystemExit(f"{path}: cannot read it: {exc.strerror or exc}") from None
        for name in names:
            start, end = _span(text, path, name)
            if name not in wants:
                wants[name] = expected(repo, name)
            want = wants[name]
            if text[start:end] != want:
                stale.append((rel, name))
                if check:
                    print(f"{rel} says ({name}):\n{text[start:end]}\nthe files say:\n{want}\n")
                text = text[:start] + want + text[end:]
        rewritten[path] = text
    if not stale:
        blocks = "; ".join(f"{rel}: {', '.join(names)}" for rel, names in FILES.items())
        print(f"every generated block matches its files ({blocks})")
        return 0
    if check:
        listed = "; ".join(f"{rel} {name} (from {BLOCKS[name][0]})" for rel, name in stale)
        print(f"these blocks differ from their files: {listed}; run `make readme-numbers`")
        return 1
    for path, text in rewritten.items():
        if path.read_text() != text:
            write_text_atomic(path, text)
    print(f"rewrote {', '.join(f'{rel} {name}' for rel, name in stale)} from their files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
