"""The README's learning numbers, rewritten from the versioned outputs of the default ``make run``.

What it does: reads ``outputs/eval/metrics.json`` (versioned by git beside ``dvc.lock``, written by the evaluate
stage) and the seed in ``params.yaml``, renders the paragraph that states the default run's warm start →
trained numbers, and either rewrites it in ``README.md`` between the ``<!-- learning:begin -->`` /
``<!-- learning:end -->`` markers (atomically) or, with ``--check``, exits 1 when the README's text differs from
what the outputs say. ``tests/test_readme_numbers.py`` runs the check, so a commit that changes the outputs
without the README (or the reverse) fails the suite: the README's numbers are the ones its commit regenerates.

What it does not: run anything. Regenerate the outputs with ``make run``, then ``make readme-numbers``.

How to run: ``python -m flows.readme_numbers [--check]``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from codea1_core.files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- learning:begin -->", "<!-- learning:end -->"
HEADLINE = "code/lab_heldout_seen/base/pass@1"


def _trio(metrics: dict[str, Any], key: str, delta: bool = True) -> str:
    """``warm → trained (+delta)`` of one metric, one decimal, as the learning table prints them."""
    warm, trained = metrics[f"warmstart/{key}"], metrics[key]
    text = f"{_num(warm)} → {_num(trained)}"
    return f"{text} ({metrics[f'delta/{key}']:+.1f})" if delta else text


def _num(value: float) -> str:
    return f"{value:.1f}".replace(".0", "") if value == int(value) else f"{value:.1f}"


def render(metrics: dict[str, Any], seed: int) -> str:
    """The README paragraph for one run's ``metrics.json`` (keys ``warmstart/…``, ``…``, ``delta/…``)."""
    return (
        f"Warm start → trained (seed {seed}): headline `{HEADLINE}` **{_trio(metrics, HEADLINE)}**, all held-out\n"
        f"problems {_trio(metrics, 'code/lab_heldout/base/pass@1')}, unseen families "
        f"{_trio(metrics, 'code/lab_heldout_unseen/base/pass@1', delta=False)}; Test LLM validity `pass@5` "
        f"{_trio(metrics, 'test/lab_heldout/pass@5')},\n"
        f"mutant kill rate `mut@5` {_trio(metrics, 'test/lab_heldout/mut@5', delta=False)} over the suites that "
        f"pass the reference (`mut@5_all`, over all suites:\n"
        f"{_trio(metrics, 'test/lab_heldout/mut@5_all', delta=False)}). Regenerated from `outputs/eval/metrics.json` "
        f"by `make readme-numbers`."
    )


def _current(readme: str, path: Path) -> tuple[int, int]:
    """Offsets of the text between the markers; a clear error when they are missing."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), readme, flags=re.S)
    if match is None:
        raise SystemExit(f"{path}: the markers {BEGIN} / {END} are missing")
    return match.start(1), match.end(1)


def expected(repo: Path = REPO) -> str:
    """What the README block must say for the outputs and params committed in ``repo``."""
    metrics_path = repo / "outputs" / "eval" / "metrics.json"
    try:
        metrics = json.loads(metrics_path.read_text())
        seed = int(yaml.safe_load((repo / "params.yaml").read_text())["seed"])
        return render(metrics, seed)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(
            f"{metrics_path}: cannot render the README's numbers ({exc!r}); run `make run` first"
        ) from None


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    args = sys.argv[1:] if argv is None else argv
    readme_path = repo / "README.md"
    readme = readme_path.read_text()
    start, end = _current(readme, readme_path)
    want = expected(repo)
    if readme[start:end] == want:
        print(f"{readme_path.name}: the learning numbers match outputs/eval/metrics.json")
        return 0
    if "--check" in args:
        print(
            f"{readme_path}: the learning numbers differ from outputs/eval/metrics.json; run `make readme-numbers`"
        )
        print(f"README says:\n{readme[start:end]}\noutputs say:\n{want}")
        return 1
    write_text_atomic(readme_path, readme[:start] + want + readme[end:])
    print(f"{readme_path.name}: learning numbers rewritten from outputs/eval/metrics.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
