"""How many honest tests the test-validity allow-list refuses (``codea1_core.method.validity``, docs/method.md D5).

What it does: applies the rule the parser applies (``call_reason`` in strict and official parse mode, and
``answer_reason``) to honest tests and prints, per corpus, how many it refuses and with which codes:

* the lab: every golden test of the three splits (``codea1_core.data.lab``), and, when a training run left
  them, the tests its Test LLM wrote and the gate kept (``outputs/train/outcomes/*.parquet``: calls and
  predicted answers), the Mistake Book's calls (``outputs/train/mistake_book.json``, under
  ``replay_reason``) and the sampled raw responses re-parsed (``--samples DIR`` of MLflow's ``samples``
  artifacts);
* real tests: every HumanEval+ / MBPP+ ``base_input`` and ``plus_input`` turned into a call as ``prepare``
  does, and the benchmarks' own asserts (HumanEval ``check``, MBPP ``test_list``, MBPP+ ``assertion``)
  parsed by ``extract_tests`` in both modes (a refused assert shows its allow-list code among the reasons).

What it does not: run any code or use a model; a corpus whose files are missing is skipped with a line.
How to run: ``python -m bench.validity_rules [--outputs outputs] [--samples DIR] [--data-dir DIR]``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RULE_CODES = {
    "walrus",
    "binding",
    "dunder",
    "forbidden_name",
    "attribute",
    "free_name",
    "not_allowed",
    "syntax",
}


def _rule_code(reason: str) -> bool:
    return reason.removeprefix("answer_") in RULE_CODES


def _calls(
    name: str, pairs: Iterable[tuple[str, str]], official: bool = False
) -> tuple[str, int, collections.Counter]:
    from codea1_core.method.validity import OK, call_reason

    codes: collections.Counter = collections.Counter()
    n = 0
    for call, entry_point in pairs:
        n += 1
        code = call_reason(call, entry_point, official)
        if code != OK and _rule_code(
            code
        ):  # a form code (MBPP+'s judged wrapper is no direct call) is no refusal
            codes[code] += 1
    return name, n, codes


def _answers(name: str, pairs: Iterable[tuple[str, str]]) -> tuple[str, int, collections.Counter]:
    from codea1_core.method.validity import OK, answer_reason

    codes: collections.Counter = collections.Counter()
    n = 0
    for answer, entry_point in pairs:
        n += 1
        code = answer_reason(answer, entry_point, literal=False)
        if code != OK and _rule_code(code):
            codes[code] += 1
    return name, n, codes


def _asserts(name: str, texts: list[tuple[str, str]], mode: str) -> tuple[str, int, collections.Counter]:
    """Asserts parsed by the parser; counted: kept and refused ones, codes: the rule's refusals."""
    from codea1_core.method.parsing import extract_tests

    codes: collections.Counter = collections.Counter()
    n = 0
    for text, entry_point in texts:
        suite = extract_tests(text, entry_point, mode)  # type: ignore[arg-type]
        refused = [r for r in suite.reasons if _rule_code(r)]
        n += len(suite.tests) + len(refused)
        codes.update(refused)
    return f"{name} ({mode})", n, codes


def lab_rows(outputs: Path, samples: Path | None) -> list[tuple[str, int, collections.Counter]]:
    from codea1_core.config import LabConfig
    from codea1_core.data.lab import lab_problems
    from codea1_core.method.mistake_book import canonical_call

    problems = [p for split in ("train", "val", "test") for p in lab_problems(LabConfig(), split)]
    rows = [_calls("lab golden tests (calls)", ((t.call, p.entry_point) for p in problems for t in p.tests))]
    eps = {p.id: p.entry_point for p in problems}
    files = sorted(glob.glob(str(outputs / "train" / "outcomes" / "*.parquet")))
    if files:
        import pandas as pd

        calls, answers = [], []
        for f in files:
            df = pd.read_parquet(f, columns=["problem_id", "calls", "expected"])
            for pid, cs, es in zip(df.problem_id, df.calls, df.expected, strict=True):
                ep = eps.get(pid, pid.split("/")[1])
                calls += [(c, ep) for c in cs]
                answers += [(a, ep) for a in es]
        rows.append(_calls(f"lab generated calls ({len(files)} steps)", calls))
        rows.append(_answers(f"lab generated answers ({len(files)} steps)", answers))
    else:
        print(f"skipped: no {outputs}/train/outcomes/*.parquet", file=sys.stderr)
    book = outputs / "train" / "mistake_book.json"
    if book.exists():
        stored = [r["call"] for rs in json.loads(book.read_text())["problems"].values() for r in rs]
        codes: collections.Counter = collections.Counter()
        for call in stored:
            try:
                canonical_call(call)
            except ValueError as exc:
                codes[str(exc).rsplit("(", 1)[-1].split(")")[0]] += 1
        rows.append(("lab Mistake Book calls (replay rule)", len(stored), codes))
    if samples is not None:
        texts = []
        for f in sorted(samples.glob("*.json")):
            data = json.loads(f.read_text())
            texts += [(row[2], row[0].split("/")[1]) for row in data["data"]]
        rows.append(_asserts(f"lab sampled responses ({len(texts)})", texts, "strict"))
    return rows


def real_rows(data_dir: Path) -> list[tuple[str, int, collections.Counter]]:
    from codea1_core.data.datasets import load_evalplus, load_humaneval

    rows = []
    for source, folder in (("humanevalplus", "humanevalplus"), ("mbppplus", "mbppplus")):
        found = sorted(glob.glob(str(data_dir / folder / "*.jsonl.gz")))
        if not found:
            print(f"skipped: no {data_dir}/{folder}/*.jsonl.gz", file=sys.stderr)
            continue
        problems = load_evalplus(found[0], source)
        pairs = [(t.call, p.entry_point) for p in problems for t in (*p.tests, *p.plus_tests)]
        rows.append(_calls(f"{source} base+plus inputs as calls", pairs))
        if source == "mbppplus":
            with gzip.open(found[0], "rt", encoding="utf-8") as fh:
                texts = [(f"```python\n{r['assertion']}\n```", r["entry_point"]) for r in map(json.loads, fh)]
            rows += [_asserts("mbppplus assertion field", texts, mode) for mode in ("strict", "official")]
    mbpp = data_dir / "mbpp" / "mbpp.jsonl"
    if mbpp.exists():
        texts = []
        for line in mbpp.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            ep = _mbpp_entry_point(row)
            if ep:
                texts.append(("```python\n" + "\n".join(row["test_list"]) + "\n```", ep))
        rows += [_asserts("mbpp test_list (974 tasks)", texts, mode) for mode in ("strict", "official")]
    try:
        problems = load_humaneval()
    except Exception as exc:  # noqa: BLE001 - the package may be missing: skip the corpus
        print(f"skipped: humaneval ({exc})", file=sys.stderr)
    else:
        rows.append(
            _calls(
                "humaneval check() asserts as calls",
                ((t.call, p.entry_point) for p in problems for t in p.tests),
            )
        )
    return rows


def _mbpp_entry_point(row: dict) -> str:
    import ast

    try:
        defs = {
            n.name
            for n in ast.parse(row["code"].replace("\r\n", "\n")).body
            if isinstance(n, ast.FunctionDef)
        }
        called = [
            n.func.id
            for a in row["test_list"]
            for n in ast.walk(ast.parse(a))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs
        ]
    except SyntaxError:
        return ""
    return called[0] if called else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs")
    parser.add_argument("--samples", type=Path, default=None)
    default_data = Path(os.environ.get("CODEA1_DATA_DIR", REPO.parent / "shared" / "data"))
    parser.add_argument("--data-dir", type=Path, default=default_data)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    rows = lab_rows(args.outputs, args.samples) + real_rows(args.data_dir)
    print("| corpus | tests | refused | codes |\n|---|---|---|---|")
    for name, n, codes in rows:
        detail = ", ".join(f"{c} {k}" for c, k in codes.most_common()) or "-"
        print(f"| {name} | {n} | {sum(codes.values())} | {detail} |")


if __name__ == "__main__":
    main()
