"""Seeded wrong samples of a reference solution, for the evaluator parity bench (``eval_bench.py --mutants``).

What it does: :func:`wrong_samples` rewrites one canonical solution (a whole program, parsed with ``ast``)
into deterministic wrong variants of its entry-point function, one per kind:

  flip_compare   one comparison operator flipped (``<`` -> ``>=``, ``==`` -> ``!=``, ``in`` -> ``not in`` ...)
  off_by_one     one integer constant + 1
  return_none    ``return None`` as the first statement of one ``if`` branch
  and_or         one ``and`` <-> ``or``
  slice_bound    one slice bound + 1
  raises         the body replaced by ``raise ValueError``
  constant       the body replaced by ``return 0``
  loops          ``while True: pass`` before the body (expensive for both evaluators: the bench asks for it
                 on a seeded subset of tasks only)

Which occurrence a kind mutates is drawn with ``random.Random(f"{seed}:{task_id}:{kind}")``, so a run is
reproducible. A kind with nothing to mutate, or whose result equals the original program, gives no sample.
Unlike ``codea1_core.evaluation.mutants`` (Cosmic-Ray's operators, for mut@k) these are the typical slips
of a model, plus the degenerate samples (raise, constant, loop) that probe each evaluator's edge cases.

What it does not: run anything. How to run: ``python bench/wrong_samples.py < program.py``.
"""

from __future__ import annotations

import ast
import copy
import random
import sys

KINDS = ("flip_compare", "off_by_one", "return_none", "and_or", "slice_bound", "raises", "constant", "loops")

_FLIP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _entry(tree: ast.Module, entry_point: str) -> ast.FunctionDef | None:
    return next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point),
        None,
    )


def _nodes(fn: ast.FunctionDef, kind: str) -> list[ast.AST]:
    out = []
    for node in ast.walk(fn):
        if kind == "flip_compare" and isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIP:
            out.append(node)
        elif kind == "off_by_one" and isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(node)
        elif kind == "return_none" and isinstance(node, ast.If):
            out.append(node)
        elif kind == "and_or" and isinstance(node, ast.BoolOp):
            out.append(node)
        elif kind == "slice_bound" and isinstance(node, ast.Slice) and (node.upper or node.lower):
            out.append(node)
    return out


def _plus_one(expr: ast.expr) -> ast.expr:
    return ast.BinOp(left=expr, op=ast.Add(), right=ast.Constant(1))


def _mutate(fn: ast.FunctionDef, kind: str, rng: random.Random) -> bool:
    """Mutate ``fn`` in place; False when the kind has nothing to mutate."""
    if kind == "raises":
        fn.body = [ast.Raise(exc=ast.Call(ast.Name("ValueError", ast.Load()), [ast.Constant("mutant")], []))]
        return True
    if kind == "constant":
        fn.body = [ast.Return(ast.Constant(0))]
        return True
    if kind == "loops":
        fn.body = [ast.While(test=ast.Constant(True), body=[ast.Pass()], orelse=[]), *fn.body]
        return True
    nodes = _nodes(fn, kind)
    if not nodes:
        return False
    node = rng.choice(nodes)
    if kind == "flip_compare":
        node.ops[0] = _FLIP[type(node.ops[0])]()
    elif kind == "off_by_one":
        node.value += 1
    elif kind == "return_none":
        node.body.insert(0, ast.Return(ast.Constant(None)))
    elif kind == "and_or":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "slice_bound":
        if node.upper is not None:
            node.upper = _plus_one(node.upper)
        else:
            node.lower = _plus_one(node.lower)
    return True


def wrong_samples(
    program: str, entry_point: str, task_id: str, seed: int = 0, kinds: tuple[str, ...] = KINDS
) -> dict[str, str]:
    """``{kind: wrong program}`` for each kind that applies to ``program``'s ``entry_point`` function."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return {}
    original = ast.unparse(tree)
    out = {}
    for kind in kinds:
        mutated = copy.deepcopy(tree)
        fn = _entry(mutated, entry_point)
        if fn is None or not _mutate(fn, kind, random.Random(f"{seed}:{task_id}:{kind}")):
            continue
        ast.fix_missing_locations(mutated)
        source = ast.unparse(mutated) + "\n"
        if source.strip() != original.strip():
            out[kind] = source
    return out


if __name__ == "__main__":
    src = sys.stdin.read()
    name = next(n.name for n in ast.parse(src).body if isinstance(n, ast.FunctionDef))
    for kind, code in wrong_samples(src, name, "stdin").items():
        print(f"# --- {kind}\n{code}")
