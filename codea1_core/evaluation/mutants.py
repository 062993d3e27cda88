"""Mutants of a reference solution, for the Test-LLM mutation score mut@k (docs/method.md §13.2).

What: :func:`generate_mutants` applies Cosmic-Ray's own mutation operators (binary/comparison/unary
operator replacement, boolean replacement, break/continue swap, number replacement, exception
replacement, decorator removal, zero-iteration loops) to a source **string in memory**, exactly as
``cosmic_ray.mutating.mutate_code`` does for one (operator, occurrence): parse with parso, walk the tree,
mutate the N-th position the operator reports, print the tree back. Identical and syntactically invalid
mutants are dropped; when more than ``max_mutants`` remain, a seeded random subset is kept.

What not: it never writes files, never runs code and never runs tests — killing mutants is the sandbox's
job (the evaluation task runs each mutant against a suite and hands a kill matrix to
:func:`codea1_core.evaluation.metrics.mut_score`). Operators that need user arguments (``VariableReplacer``,
``VariableInserter``) and the ``NoOp`` operator are not used.

How to run: ``python -c "from codea1_core.evaluation.mutants import generate_mutants; print(generate_mutants(src))"``.
"""

from __future__ import annotations

import ast
import random
import warnings
from dataclasses import dataclass
from typing import Any

from cosmic_ray.ast import ast_nodes, get_ast
from cosmic_ray.exceptions import CosmicRayTestingException
from cosmic_ray.mutating import mutate_code
from cosmic_ray.operators.provider import OperatorProvider

PROVIDER = "core"
"""Cosmic-Ray's provider name; operator names read ``core/ReplaceBinaryOperator_Add_Sub`` as in its CLI."""

_EXCEPTION_STUB = f"\n\nclass {CosmicRayTestingException.__name__}(Exception):\n    pass\n"
"""``ExceptionReplacer`` renames handled exceptions to Cosmic-Ray's testing exception; a mutant must
define that name itself to be self-contained (Cosmic-Ray imports it from its own package)."""


@dataclass(frozen=True)
class Mutant:
    """One mutated program.

    Attributes:
        operator: Cosmic-Ray operator name, e.g. ``core/ReplaceComparisonOperator_Lt_LtE``.
        occurrence: Which of the operator's positions in the source was mutated (0-based, Cosmic-Ray order).
        source: The complete mutated source.
    """

    operator: str
    occurrence: int
    source: str


def _operators() -> list[tuple[str, Any]]:
    """Instances of every argument-free Cosmic-Ray core operator, in the provider's (stable) order."""
    provider = OperatorProvider()
    out = []
    for name in provider:
        cls = provider[name]
        if cls.arguments():
            continue  # needs user-chosen variable names
        out.append((f"{PROVIDER}/{name}", cls()))
    return out


def _candidates(source: str) -> list[tuple[str, Any, int]]:
    """All (operator name, operator, occurrence) pairs that apply to ``source``."""
    nodes = list(ast_nodes(get_ast(source)))
    out: list[tuple[str, Any, int]] = []
    for name, operator in _operators():
        count = sum(len(list(operator.mutation_positions(node))) for node in nodes)
        out.extend((name, operator, i) for i in range(count))
    return out


def _ast_key(source: str) -> str | None:
    """Normalized AST dump, or None when ``source`` is not valid Python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. SyntaxWarning for ``x is 1`` produced by an operator
        try:
            return ast.dump(ast.parse(source))
        except (SyntaxError, ValueError):
            return None


def _apply(source: str, name: str, operator: Any, occurrence: int) -> str | None:
    """One mutation, in memory (``cosmic_ray.mutating.mutate_code``); None when it does not apply."""
    try:
        mutated = mutate_code(source, operator, occurrence)
    except Exception:  # noqa: BLE001 - an operator that chokes on unusual syntax yields no mutant
        return None
    if mutated is not None and name.endswith("/ExceptionReplacer"):
        mutated += _EXCEPTION_STUB
    return mutated


def generate_mutants(source: str, max_mutants: int = 30, seed: int = 0) -> list[Mutant]:
    """Distinct, syntactically valid first-order mutants of ``source``.

    Args:
        source: Python source (typically a reference solution).
        max_mutants: Keep at most this many (0 = all). When more exist, a subset is drawn with a
            ``random.Random(seed)`` shuffle of the candidate list, then returned in operator order.
        seed: Seed of that subset.

    Returns:
        Mutants in Cosmic-Ray operator order, then occurrence. Mutants whose AST equals the original's
        or an earlier mutant's are dropped, as are mutants that do not parse.

    Raises:
        ValueError: ``source`` is not valid Python, or ``max_mutants`` is negative.
    """
    if max_mutants < 0:
        raise ValueError(f"max_mutants must be >= 0, got {max_mutants}")
    original_key = _ast_key(source)
    if original_key is None:
        raise ValueError("generate_mutants: source is not valid Python")
    candidates = _candidates(source)
    order = list(range(len(candidates)))
    if max_mutants and len(order) > max_mutants:
        random.Random(seed).shuffle(order)
    seen = {original_key}
    kept: list[int] = []
    sources: dict[int, str] = {}
    for idx in order:
        name, operator, occurrence = candidates[idx]
        mutated = _apply(source, name, operator, occurrence)
        key = _ast_key(mutated) if mutated is not None else None
        if mutated is None or key is None or key in seen:
            continue
        seen.add(key)
        kept.append(idx)
        sources[idx] = mutated
        if max_mutants and len(kept) == max_mutants:
            break
    return [Mutant(candidates[i][0], candidates[i][2], sources[i]) for i in sorted(kept)]
