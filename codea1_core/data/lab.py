"""The built-in CPU lab: short, parametrized problem families with boundary bugs, and warm-start data.

What it does: each :class:`Family` is a one-line function whose behaviour hinges on a boundary
(strict vs non-strict comparison, an off-by-one range, the empty list, surrounding whitespace,
rounding). A family is instantiated with seeded parameters into :class:`Problem` objects with a
reference solution, golden tests whose expected values come from running that (trusted, our own)
reference in-process (docs/method.md D1), and typical buggy variants that fail at least one golden test.
Golden tests come in two coverages (``lab.golden_tests``): ``boundary`` (exhaustive, an oracle ceiling)
and ``sparse`` (a few happy-path asserts, like MBPP's, that many buggy variants pass); training sees
the selected one, evaluation always the full set with the sparse calls named in the metadata.
Held-out parameters form the ``val``/``test`` splits; families marked ``heldout`` appear only in ``test``.

What it does not: render the warm-start conversations or the tokenizer corpus
(:mod:`codea1_core.data.warmstart_data`), build or train models (``tiny_model.py``, ``sft.py``), or run model
output (only ``sandbox/`` runs untrusted code).

How to run: ``python -c "from codea1_core.data.lab import lab_problems; from codea1_core.config import LabConfig;
print(lab_problems(LabConfig(), 'train')[0].prompt)"``; tests in ``tests/core/data/test_lab.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codea1_core.config import ConfigError, LabConfig
from codea1_core.types import Problem, TestCase

Params = dict[str, Any]
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Family:
    """One parametrized problem family: templates are ``str.format``-ed with the sampled params."""

    name: str
    """The entry point, distinct across families."""
    args: str
    """Parameter list of the entry point, e.g. ``"xs"``."""
    sample: Callable[[random.Random], Params]
    """Draws one parameter set (a dict of ints/strs, including derived values used by templates)."""
    description: str
    """One-sentence behaviour description template."""
    body: str
    """Reference body template (one line, without indentation)."""
    bugs: tuple[str, ...]
    """Buggy body templates: typical boundary mistakes."""
    boundary: Callable[[Params], list[tuple]]
    """Argument tuples on and around the boundary (golden tests)."""
    typical: Callable[[Params, random.Random], tuple]
    """Draws one ordinary (non-boundary) argument tuple."""
    heldout: bool = False
    """Held-out family: only in the ``test`` split, never trained on."""

    def source(self, body: str, params: Params) -> str:
        """A complete function definition with ``body`` filled from ``params``."""
        return f"def {self.name}({self.args}):\n    {body.format(**params)}"


# --------------------------------------------------------------------------------------------------
# Input helpers
# --------------------------------------------------------------------------------------------------


def _int_list(r: random.Random, lo: int, hi: int, max_len: int = 5) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(0, max_len))]


_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_WORDS = ("cat", "Dog", "sun", "Tree", "hello", "Bob", "data", "code", "Mix", "apple")


def _word(r: random.Random) -> str:
    word = r.choice(_WORDS)
    return " " * r.randint(0, 2) + word + " " * r.randint(0, 2)


_SUM_STARTS = [a for a in range(-20, 41) if a != 0]
"""sum_from starts (0 excluded: summing from 1 instead of 0 is no bug)."""
_UNIT_FACTORS = [k for k in range(2, 100) if k not in (47, 49, 87)]
"""to_units factors for which both bugs fail a golden input (checked by tests/core/data/test_lab.py)."""


def _threshold(lo: int, hi: int) -> Callable[[random.Random], Params]:
    return lambda r: {"t": r.randint(lo, hi)}


def _span(r: random.Random) -> Params:
    lo = r.randint(-20, 50)
    return {"lo": lo, "hi": lo + r.randint(2, 30)}


def _window(r: random.Random) -> Params:
    a, width = r.randint(0, 9), r.randint(1, 6)
    return {"a": a, "b": a + width, "a1": a + 1, "b1": a + width + 1}


def _around(p: Params, key: str) -> list[tuple]:
    return [(p[key] - 1,), (p[key],), (p[key] + 1,)]


# --------------------------------------------------------------------------------------------------
# The families
# --------------------------------------------------------------------------------------------------

# Columns: name, args, sample, description, body, bugs, boundary inputs, typical input.
# fmt: off
_FAMILY_LIST = [
    Family("is_above", "x", _threshold(-20, 100), "Return True if x is greater than {t}, else False.",
           "return x > {t}", ("return x >= {t}",),
           lambda p: [*_around(p, "t"), (p["t"] + 10,)], lambda p, r: (r.randint(p["t"] - 30, p["t"] + 30),)),
    Family("at_most", "x", _threshold(-20, 100), "Return True if x is at most {t}, else False.",
           "return x <= {t}", ("return x < {t}",),
           lambda p: [*_around(p, "t"), (p["t"] - 10,)], lambda p, r: (r.randint(p["t"] - 30, p["t"] + 30),)),
    Family("in_range", "x", _span, "Return True if x is between {lo} and {hi} inclusive, else False.",
           "return {lo} <= x <= {hi}", ("return {lo} < x <= {hi}", "return {lo} <= x < {hi}", "return {lo} < x < {hi}"),
           lambda p: [*_around(p, "lo"), *_around(p, "hi")], lambda p, r: (r.randint(p["lo"] - 20, p["hi"] + 20),)),
    Family("sum_from", "n", lambda r: (lambda a: {"a": a, "a1": a + 1})(r.choice(_SUM_STARTS)),
           "Return the sum of the integers from {a} to n inclusive (0 if n < {a}).",
           "return sum(range({a}, n + 1))", ("return sum(range({a}, n))", "return sum(range({a1}, n + 1))"),
           lambda p: [(p["a"] - 1,), (p["a"],), (p["a"] + 1,), (p["a"] + 5,)],
           lambda p, r: (r.randint(p["a"] - 3, p["a"] + 20),)),
    Family("count_below", "xs", _threshold(-10, 50), "Return how many numbers in the list xs are less than {t}.",
           "return len([x for x in xs if x < {t}])",
           ("return len([x for x in xs if x <= {t}])", "return len([x for x in xs[1:] if x < {t}])"),
           lambda p: [([],), ([p["t"]],), ([p["t"] - 1],), ([p["t"] + 1, p["t"], p["t"] - 2],)],
           lambda p, r: (_int_list(r, p["t"] - 10, p["t"] + 10),)),
    Family("first_or", "xs", lambda r: {"d": r.randint(-50, 50)},
           "Return the first element of the list xs, or {d} if xs is empty.",
           "return xs[0] if xs else {d}", ("return xs[0] if len(xs) > 1 else {d}", "return xs[-1] if xs else {d}"),
           lambda p: [([],), ([p["d"] + 3],), ([4, p["d"] + 7],), ([1, 2, 3],)], lambda p, r: (_int_list(r, -20, 20),)),
    Family("tidy", "s", lambda r: {"case": r.choice(["lower", "upper"]), "n": r.randint(1, 30)},
           "Return s with surrounding spaces removed, in {case} case, followed by {n} '!' characters.",
           'return s.strip().{case}() + "!" * {n}', ('return s.{case}() + "!" * {n}', 'return s.strip() + "!" * {n}'),
           lambda p: [("",), (" Hi ",), ("oK",), ("  a b  ",)], lambda p, r: (_word(r),)),
    Family("to_units", "x", lambda r: {"k": r.choice(_UNIT_FACTORS)},
           "Return x times {k}, rounded to the nearest integer.",
           "return round(x * {k})", ("return int(x * {k})", "return round(x) * {k}"),
           lambda p: [(0.0,), (0.9,), (-0.9,), (1.45,), (0.07,), (0.37,), (0.13,)],
           lambda p, r: (round(r.uniform(-5, 5), 2),)),
    Family("clamp", "x", _span,
           "Return x limited to the range {lo} to {hi}: smaller values become {lo}, larger ones {hi}.",
           "return max({lo}, min({hi}, x))", ("return min({hi}, x)", "return max({lo}, min({hi} - 1, x))"),
           lambda p: [(p["lo"] - 1,), (p["lo"],), (p["hi"],), (p["hi"] + 1,)],
           lambda p, r: (r.randint(p["lo"] - 20, p["hi"] + 20),)),
    Family("window", "xs", _window,
           "Return the elements of the list xs from index {a} to index {b} inclusive.",
           "return xs[{a}:{b1}]", ("return xs[{a}:{b}]", "return xs[{a1}:{b1}]"),
           lambda p: [(list(range(10, 13 + p["b"])),), (list(range(1, p["b"] + 2)),), ([],)],
           lambda p, r: (_int_list(r, 0, 9, max_len=12),)),
    Family("count_char", "s", lambda r: {"c": "".join(r.choices(_LETTERS, k=r.choice([1, 1, 2])))},
           "Return how many times '{c}' appears in s, ignoring case.",
           'return s.lower().count("{c}")', ('return s.count("{c}")', 'return s.upper().count("{c}")'),
           lambda p: [("",), (p["c"],), (p["c"].upper(),), (f"x{p['c']}{p['c'].upper()}y",)],
           lambda p, r: (_word(r).strip() + r.choice([p["c"], p["c"].upper(), ""]),)),
    Family("mean_or", "xs", lambda r: {"d": r.randint(-30, 30)},
           "Return the average of the numbers in xs rounded to 2 decimals, or {d} if xs is empty.",
           "return round(sum(xs) / len(xs), 2) if xs else {d}",
           ("return round(sum(xs) / len(xs), 2)", "return round(sum(xs) / len(xs)) if xs else {d}"),
           lambda p: [([],), ([5],), ([1, 2, 2],), ([-1, 2],)], lambda p, r: (_int_list(r, -10, 10),)),
    Family("distance", "x", _threshold(-20, 50), "Return the absolute difference between x and {t}.",
           "return abs(x - {t})", ("return x - {t}", "return {t} - x"),
           lambda p: [(p["t"] - 5,), (p["t"],), (p["t"] + 5,)], lambda p, r: (r.randint(p["t"] - 30, p["t"] + 30),)),
    # Held-out families (evaluation only): recombine boundaries seen in training.
    Family("grade", "score", _threshold(30, 90), "Return 'pass' if score is at least {t}, otherwise 'fail'.",
           'return "pass" if score >= {t} else "fail"', ('return "pass" if score > {t} else "fail"',),
           lambda p: [*_around(p, "t"), (0,)], lambda p, r: (r.randint(0, 100),), heldout=True),
    Family("count_between", "xs", _span,
           "Return how many numbers in the list xs are between {lo} and {hi} inclusive.",
           "return len([x for x in xs if {lo} <= x <= {hi}])",
           ("return len([x for x in xs if {lo} < x <= {hi}])", "return len([x for x in xs if {lo} <= x < {hi}])"),
           lambda p: [([],), ([p["lo"]],), ([p["hi"]],), ([p["lo"] - 1, p["lo"], p["hi"], p["hi"] + 1],)],
           lambda p, r: (_int_list(r, p["lo"] - 10, p["hi"] + 10),), heldout=True),
    Family("is_close", "x", lambda r: {"t": r.randint(-20, 50), "d": r.randint(1, 9)},
           "Return True if x differs from {t} by at most {d}, else False.",
           "return abs(x - {t}) <= {d}", ("return abs(x - {t}) < {d}", "return x - {t} <= {d}"),
           lambda p: [(p["t"] + p["d"],), (p["t"] - p["d"],), (p["t"] - p["d"] - 1,), (p["t"],)],
           lambda p, r: (r.randint(p["t"] - 20, p["t"] + 20),), heldout=True),
]
# fmt: on

FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILY_LIST}
"""All lab families by name (the name is also the entry point)."""


def _mid(p: Params) -> int:
    return (p["lo"] + p["hi"]) // 2


# Sparse golden tests (``lab.golden_tests: sparse``): the two or three happy-path asserts a person writes
# first, like MBPP's three per problem. They avoid the exact boundary on purpose, so at least half of each
# family's buggy variants pass them (the comment names which); tests/core/data/test_lab.py checks that share.
# fmt: off
_SPARSE: dict[str, Callable[[Params], list[tuple]]] = {
    "is_above": lambda p: [(p["t"] + 10,), (p["t"] - 10,), (p["t"] + 25,)],  # x >= t passes
    "at_most": lambda p: [(p["t"] - 10,), (p["t"] + 10,), (p["t"] - 25,)],  # x < t passes
    "in_range": lambda p: [(_mid(p),), (p["lo"] - 10,), (p["hi"] + 10,)],  # all three pass
    "sum_from": lambda p: [(p["a"] - 1,), (p["a"] - 4,)],  # the "0 if n < a" clause: both pass
    "count_below": lambda p: [([p["t"] + 5, p["t"] - 3, p["t"] - 4],), ([p["t"] + 1, p["t"] + 2],), ([],)],  # both
    "first_or": lambda p: [([1, 2, 3],), ([7, 4],), ([],)],  # len(xs) > 1 passes
    "tidy": lambda p: [("Dog",), (getattr("hello", p["case"])(),), ("Tree",)],  # no strip() passes
    "to_units": lambda p: [(1.0,), (2.0,), (10.0,)],  # whole inputs: both pass
    "clamp": lambda p: [(_mid(p),), (p["lo"] + 1,), (p["hi"] + 5,)],  # no lower bound passes
    "window": lambda p: [([],), (list(range(1, p["b"] + 1)),)],  # xs[a:b] passes on a list of length b
    "count_char": lambda p: [(f"{p['c']}-{p['c']}",), ("123",)],  # case-sensitive count passes
    "mean_or": lambda p: [([2, 4],), ([1, 2],), ([5],)],  # no empty check passes
    "distance": lambda p: [(p["t"] + 7,), (p["t"],), (p["t"] + 2,)],  # x - t passes
    "grade": lambda p: [(p["t"] + 10,), (p["t"] - 10,), (100,)],  # score > t passes
    "count_between": lambda p: [([_mid(p), p["lo"] - 5, p["hi"] + 5],), ([],), ([_mid(p)],)],  # both pass
    "is_close": lambda p: [(p["t"],), (p["t"] + p["d"] + 5,), (p["t"] - p["d"] - 5,)],  # strict < passes
}
# fmt: on

_TYPICAL_TESTS = 2
"""Ordinary inputs added to each problem's boundary inputs in its golden tests."""


# --------------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------------


def call_text(name: str, args: tuple) -> str:
    """The call expression of ``name`` on ``args`` (each argument's ``repr``)."""
    return f"{name}({', '.join(repr(a) for a in args)})"


def evaluate_trusted(source: str, calls: list[str]) -> list[Any]:
    """Run OUR OWN trusted code (a reference or a buggy variant) in-process; exceptions become values."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - trusted lab templates only, never model output
    results: list[Any] = []
    for call in calls:
        try:
            results.append(eval(call, namespace))  # noqa: S307 - same trusted code
        except Exception as exc:  # a buggy variant may raise (e.g. ZeroDivisionError on [])
            results.append(exc)
    return results


def _fails(source: str, tests: tuple[TestCase, ...]) -> bool:
    """True when ``source`` misses at least one golden test (an exception is a miss)."""
    got = evaluate_trusted(source, [t.call for t in tests])
    return any(isinstance(g, Exception) or g != t.expected for g, t in zip(got, tests, strict=True))


def _param_sets(
    family: Family, seed: int, count: int, keys: str = "lab.train_per_family or lab.heldout_per_family"
) -> list[Params]:
    """``count`` distinct parameter sets in a fixed order: test, val, train, then warm-start only (stable splits).

    The order is prefix-stable: asking for more sets never changes the first ones, so extra warm-start
    problems leave every split as it was. ``keys`` names the settings to lower when a family runs out.
    """
    rng = random.Random(f"codea1-lab/{seed}/{family.name}")
    found: list[Params] = []
    for _ in range(100 * count + 100):
        if len(found) == count:
            return found
        params = family.sample(rng)
        if params not in found:
            found.append(params)
    if len(found) == count:
        return found
    raise ConfigError(
        f"lab: family {family.name!r} has fewer than {count} distinct parameter sets; lower {keys}"
    )


def _golden(family: Family, reference: str, arg_tuples: list[tuple]) -> tuple[TestCase, ...]:
    """Distinct calls of ``arg_tuples`` with the reference's answers (a raising reference is our defect)."""
    calls = list(dict.fromkeys(call_text(family.name, args) for args in arg_tuples))
    expected = evaluate_trusted(reference, calls)
    for call, value in zip(calls, expected, strict=True):
        if isinstance(value, Exception):  # a defect of this module, not of user input
            raise RuntimeError(f"lab family {family.name}: reference raised on {call}: {value!r}")
    return tuple(TestCase(call, value) for call, value in zip(calls, expected, strict=True))


def _layout(
    full: tuple[TestCase, ...], sparse: tuple[TestCase, ...], split: str, golden_tests: str
) -> tuple[tuple[TestCase, ...], tuple[TestCase, ...]]:
    """``(tests, plus_tests)`` of one problem: what training sees in ``tests``.

    ``test`` (evaluation) always gets the full boundary set as ``tests`` (so ``base`` pass@k is over the
    same tests whatever the setting) and the sparse calls it lacks as ``plus_tests``. Training splits get
    the selected set: ``boundary`` the boundary set alone (no plus), ``sparse`` the sparse tests with the
    rest as plus.
    """
    if split == "test":
        known = {t.call for t in full}
        return full, tuple(t for t in sparse if t.call not in known)
    if golden_tests == "boundary":
        return full, ()
    chosen = {t.call for t in sparse}
    return sparse, tuple(t for t in full if t.call not in chosen)


def _make_problem(
    family: Family, params: Params, index: int, split: str, seed: int, golden_tests: str = "boundary"
) -> Problem:
    rng = random.Random(f"codea1-lab/{seed}/{family.name}/{index}/typical")
    arg_tuples = family.boundary(params) + [family.typical(params, rng) for _ in range(_TYPICAL_TESTS)]
    reference = family.source(family.body, params)
    full = _golden(family, reference, arg_tuples)
    sparse = _golden(family, reference, _SPARSE[family.name](params))
    buggy = list(dict.fromkeys(family.source(b, params) for b in family.bugs))
    buggy = [b for b in buggy if b != reference and _fails(b, full)]
    tests, plus_tests = _layout(full, sparse, split, golden_tests)
    sentence = family.description.format(**params)
    signature = f"{family.name}({family.args})"
    return Problem(
        id=f"lab/{family.name}/{index}",
        source="lab",
        split=split,
        prompt=f'def {signature}:\n    """{sentence}"""\n',
        description=f"Write a function {signature}. {sentence}",
        entry_point=family.name,
        reference_solution=reference,
        tests=tests,
        plus_tests=plus_tests,
        metadata={
            "family": family.name,
            "params": dict(params),
            "buggy": buggy,
            "sparse_calls": [t.call for t in sparse],
        },
    )


def _training_families(lab_cfg: LabConfig) -> list[Family]:
    if not lab_cfg.families:
        return [f for f in _FAMILY_LIST if not f.heldout]
    chosen = []
    for name in lab_cfg.families:
        if name not in FAMILIES:
            raise ConfigError(f"lab.families: unknown family {name!r} (known: {', '.join(FAMILIES)})")
        if FAMILIES[name].heldout:
            raise ConfigError(f"lab.families: {name!r} is a held-out family (evaluation only)")
        chosen.append(FAMILIES[name])
    return chosen


def training_family_names(lab_cfg: LabConfig) -> list[str]:
    """Entry points of the families the lab models are trained on (what ``codea1 attack`` can speak to)."""
    return [f.name for f in _training_families(lab_cfg)]


def lab_problems(lab_cfg: LabConfig, split: str) -> list[Problem]:
    """The lab problems of one split, deterministic in ``lab_cfg.seed``.

    Args:
        lab_cfg: The ``lab`` config section (families, sizes, seed).
        split: ``train`` (``train_per_family`` per training family), ``val`` (``heldout_per_family``
            other parameters per training family) or ``test`` (yet other parameters per training
            family, plus every held-out family).

    Returns:
        Problems with ids ``lab/<family>/<i>``; ``i`` is unique across splits within a family. Their
        ``tests`` follow ``lab_cfg.golden_tests`` on ``train``/``val`` and are always the full boundary
        set on ``test`` (see :func:`_layout`); ``metadata["sparse_calls"]`` names the sparse tests.

    Raises:
        ConfigError: Unknown split, family or a size a family cannot supply (every family offers at
            least 60 distinct parameter sets: ``train_per_family + 2 * heldout_per_family <= 60``).
    """
    if split not in SPLITS:
        raise ConfigError(f"lab split {split!r}: expected one of {list(SPLITS)}")
    for key in ("train_per_family", "heldout_per_family"):
        if getattr(lab_cfg, key) < 0:
            raise ConfigError(f"lab.{key}: must be >= 0, got {getattr(lab_cfg, key)}")
    n_held, n_train = lab_cfg.heldout_per_family, lab_cfg.train_per_family
    start, stop = {
        "test": (0, n_held),
        "val": (n_held, 2 * n_held),
        "train": (2 * n_held, 2 * n_held + n_train),
    }[split]
    problems = []
    for family in _training_families(lab_cfg):
        params = _param_sets(family, lab_cfg.seed, 2 * n_held + n_train)
        problems += [
            _make_problem(family, params[i], i, split, lab_cfg.seed, lab_cfg.golden_tests)
            for i in range(start, stop)
        ]
    if split == "test":
        for family in (f for f in _FAMILY_LIST if f.heldout):
            params = _param_sets(family, lab_cfg.seed, n_held)
            problems += [_make_problem(family, params[i], i, split, lab_cfg.seed) for i in range(n_held)]
    return problems


def warmstart_code_problems(lab_cfg: LabConfig, train: list[Problem]) -> list[Problem]:
    """The Code LLM's warm-start problems: ``train`` plus fresh parameter sets of each training family.

    Up to ``lab.warmstart_code_problems_per_family`` sets per family, drawn after the test, val and train
    sets (so none is ever evaluated on; ids continue ``lab/<family>/<i>``). Many distinct constants make
    copying the prompt's constants the only way to fit the data; a dozen can be memorized.

    Raises:
        ConfigError: A family cannot supply that many distinct parameter sets (the key is named).
    """
    n_held, n_train = lab_cfg.heldout_per_family, lab_cfg.train_per_family
    wanted = lab_cfg.warmstart_code_problems_per_family
    if wanted <= n_train:
        return list(train)
    key = "lab.warmstart_code_problems_per_family or lab.heldout_per_family"
    extra = []
    for family in _training_families(lab_cfg):
        params = _param_sets(family, lab_cfg.seed, 2 * n_held + wanted, key)
        first = 2 * n_held + n_train
        extra += [
            _make_problem(family, params[i], i, "train", lab_cfg.seed, lab_cfg.golden_tests)
            for i in range(first, 2 * n_held + wanted)
        ]
    return [*train, *extra]


def check_lab_config(lab_cfg: LabConfig) -> None:
    """Raise :class:`ConfigError` (naming the ``lab.*`` key) for settings the lab cannot use."""
    if not 0.0 <= lab_cfg.buggy_fraction <= 1.0:
        raise ConfigError(f"lab.buggy_fraction: must be within [0, 1], got {lab_cfg.buggy_fraction}")
    for role in ("code", "test"):
        key = f"warmstart_{role}_examples_per_problem"
        if getattr(lab_cfg, key) < 1:
            raise ConfigError(f"lab.{key}: must be >= 1, got {getattr(lab_cfg, key)}")
    for split in SPLITS:
        lab_problems(lab_cfg, split)
    warmstart_code_problems(lab_cfg, [])


def buggy_variants(problem: Problem) -> list[str]:
    """The typical buggy solutions of a lab problem (each fails >= 1 boundary test); [] for other sources."""
    return list(problem.metadata.get("buggy", []))
