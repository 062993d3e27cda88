"""The test-validity rules, in one place: what makes a generated test's call and predicted answer acceptable.

What it does: the per-test checks, each returning a reason code (``"ok"`` when acceptable).

* :func:`expression_reason` — the allow-list: what a call or answer may contain, so that an expected value
  is a function of the reference and the call's literal text only. Allowed: literals and containers,
  arithmetic, comparisons, boolean and conditional operators, subscripts and slices, f-strings, names of the
  entry point and of :data:`SAFE_BUILTINS` (called or passed), lambdas without defaults and comprehensions
  whose parameters and loop variables are plain new names, and attributes without a leading underscore of a
  fresh value built from literals (``' '.join(...)``, ``float('inf').is_integer()``). Everything
  else is refused with the code of its first offending part: ``walrus`` (``:=`` anywhere, in a
  comprehension or lambda too: it binds in the program's namespace), ``binding`` (a lambda default, a
  parameter or loop variable hiding a name the expression may use, a loop target that is not a name),
  ``dunder``, ``forbidden_name`` (:data:`FORBIDDEN_NAMES`, as a name or an attribute: ``globals()``,
  ``setattr``, ``eval``...), ``attribute`` (of what the program defines or returns, or of a name bound in the
  expression: a generator's ``gi_frame.f_globals`` reaches the namespace without a dunder), ``free_name``
  (any other name), ``not_allowed`` (any other construct: calling a returned object, ...), ``syntax``
  (``await``, ``yield``). Predicted answers may also read other names (their value decides their own
  test only); :func:`replay_reason` is the same rule for a Mistake-Book call, whose entry point the book
  does not keep.
* :func:`is_plain_literal` — the predicted answer is plain data (``codea1_core.types.literal_value``) that
  names no entry point (``tests.literal_answers``; reason ``expected_not_literal``).
* :func:`call_reason` / :func:`answer_reason` — the form of a call (``call_syntax``, ``not_a_call``,
  ``wrong_function`` in strict parse mode) or answer (``answer_syntax``, ``expected_not_literal``), then the
  allow-list (answer codes prefixed ``answer_``).

Who applies them: the parser (:mod:`codea1_core.method.parsing`) refuses, counted invalid, every assert
whose answer is not plain data or whose call or answer the allow-list refuses — so training, evaluation
(``codea1_core.evaluation.suites.plan_suites``, which runs no gate) and every other caller only ever run
allowed expressions; the Mistake Book (:func:`codea1_core.method.mistake_book.canonical_call`) holds its
stored and loaded calls to :func:`replay_reason`. :func:`suite_checks` gives the generated-test gate
(``tasks.quality.gx_gate_tests``) the code of every kept test: the call and answer codes above and
``duplicate`` (the same call source as an earlier test of the suite).

Sources are NFKC-normalised before the call and answer checks, as Python does for identifiers
(``ｅｖａｌ`` is ``eval``). The rule decides which expressions run at all; what a program does when it runs
is contained by the sandbox only.
What it does not: parse model responses (``parsing``), check lengths or missing fields (the gate's GX
expectations do), or decide a batch (the gate does).
How to test: ``pytest tests/core/method/test_validity.py``; how many honest tests the rule refuses:
``python -m bench.validity_rules`` (docs/method.md D5).
"""

from __future__ import annotations

import ast
import functools
import re
import unicodedata
from collections.abc import Sequence

from codea1_core.types import ParsedTest, literal_value

OK = "ok"
DUPLICATE = "duplicate"
FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "exit",
        "quit",
        "importlib",
        "help",
        "memoryview",
    }
)
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)
_INT = r"-?(?:0|[1-9][0-9]*)"
_ATOM = rf"{_INT}(?:\.[0-9]+)?|True|False|None|'[^'\\\n]*'|\"[^\"\\\n]*\""
_MAX_FAST_CHARS = 4000
"""Longest answer :func:`is_plain_literal` accepts by its pattern alone (printable, so no character a string
literal cannot hold): Python refuses int literals of over 4,300 digits (``sys.get_int_max_str_digits``), so a
longer one takes the parse."""
_SIMPLE_LITERAL = re.compile(rf"(?:{_ATOM})|\[ *(?:{_INT} *(?:, *{_INT} *)*,? *)?\]")


def is_plain_literal(answer: str, entry_point: str, tree: ast.Expression | None = None) -> bool:
    """True when ``answer`` is plain data (no call, no name of the function under test).

    ``tree``: ``answer`` already parsed (``mode="eval"``), to skip a second parse.
    """
    if len(answer) <= _MAX_FAST_CHARS and answer.isprintable() and _SIMPLE_LITERAL.fullmatch(answer):
        return True  # a number, bool, None, plain string or flat int list: data, and no name at all
    try:
        if tree is None:
            tree = ast.parse(answer, mode="eval")
        if any(isinstance(n, ast.Name) and n.id == entry_point for n in ast.walk(tree)):
            return False
        literal_value(answer)
    except (*_PARSE_ERRORS, TypeError):
        return False
    return True


SAFE_BUILTINS = frozenset(
    {
        "abs",
        "all",
        "any",
        "ascii",
        "bin",
        "bool",
        "bytearray",
        "bytes",
        "chr",
        "complex",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "format",
        "frozenset",
        "hex",
        "int",
        "isinstance",
        "iter",
        "len",
        "list",
        "map",
        "max",
        "min",
        "next",
        "oct",
        "ord",
        "pow",
        "range",
        "repr",
        "reversed",
        "round",
        "set",
        "slice",
        "sorted",
        "str",
        "sum",
        "tuple",
        "zip",
    }
)
"""Builtins a call or answer may name: pure functions of their arguments that reach no namespace, frame or
type machinery (no ``type``, ``getattr``, ``hash``, ``id``: a value must follow from the text alone)."""
_INERT_NODES = (
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.Starred,
    ast.keyword,
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.Subscript,
    ast.Slice,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class _Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _is_dunder(name: str) -> bool:
    return name.startswith("__")


class _AllowList:
    """Walks one expression and raises :class:`_Refused` at the first part outside the allow-list.

    ``callables``: the names beside :data:`SAFE_BUILTINS` that the expression may use (the entry point);
    ``local``: names bound by an enclosing lambda or comprehension of the expression itself.
    """

    def __init__(self, callables: frozenset[str], free_names: bool) -> None:
        self.callables, self.free_names = callables, free_names
        self.reserved = callables | SAFE_BUILTINS  # never shadowed by a lambda parameter or loop variable

    def visit(self, node: ast.AST, local: frozenset[str]) -> None:
        if isinstance(node, ast.NamedExpr):
            raise _Refused("walrus")
        if isinstance(node, ast.Name):
            self.name(node.id, local)
        elif isinstance(node, ast.Attribute):
            self.attribute(node, local)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name | ast.Attribute | ast.Lambda):
                raise _Refused("not_allowed")  # calling what an expression returns: f(1)(2), [f][0](1)
            self.children(node, local)
        elif isinstance(node, ast.Lambda):
            self.visit(node.body, local | self.parameters(node.args))
        elif isinstance(node, _COMPREHENSIONS):
            self.comprehension(node, local)
        elif isinstance(node, ast.Await | ast.Yield | ast.YieldFrom):
            raise _Refused("syntax")
        elif isinstance(node, _INERT_NODES):
            self.children(node, local)
        else:
            raise _Refused("not_allowed")

    def children(self, node: ast.AST, local: frozenset[str]) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child, local)

    def name(self, name: str, local: frozenset[str]) -> None:
        if _is_dunder(name):
            raise _Refused("dunder")
        if name in FORBIDDEN_NAMES:
            raise _Refused("forbidden_name")
        if not self.free_names and name not in self.reserved and name not in local:
            raise _Refused("free_name")

    def bind(self, name: str) -> str:
        """A lambda parameter or loop variable: local to the expression, never hiding a name it may use."""
        if _is_dunder(name) or name in FORBIDDEN_NAMES or name in self.reserved:
            raise _Refused("binding")
        return name

    def parameters(self, args: ast.arguments) -> frozenset[str]:
        if args.defaults or any(d is not None for d in args.kw_defaults):
            raise _Refused("binding")  # a default is evaluated once and kept by the function object
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        return frozenset(self.bind(a.arg) for a in every if a is not None)

    def comprehension(self, node: ast.AST, local: frozenset[str]) -> None:
        inner = local
        for gen in node.generators:  # type: ignore[attr-defined]
            if gen.is_async:
                raise _Refused("syntax")
            self.visit(gen.iter, inner)
            targets = [gen.target] if isinstance(gen.target, ast.Name) else getattr(gen.target, "elts", None)
            if not targets or not all(isinstance(t, ast.Name) for t in targets):
                raise _Refused("binding")  # a[0] or x.y as a loop target writes into an object
            inner = inner | {self.bind(t.id) for t in targets}
            for cond in gen.ifs:
                self.visit(cond, inner)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):  # type: ignore[attr-defined]
            self.visit(part, inner)

    @staticmethod
    def attribute_name(attr: str) -> None:
        if _is_dunder(attr):
            raise _Refused("dunder")
        if attr in FORBIDDEN_NAMES:
            raise _Refused("forbidden_name")
        if attr.startswith("_"):
            raise _Refused("attribute")

    def attribute(self, node: ast.Attribute, local: frozenset[str]) -> None:
        self.attribute_name(node.attr)
        self.visit(node.value, local)  # its own parts first: their code is the more precise one
        if not self.inert(node.value):
            raise _Refused("attribute")

    def inert(self, node: ast.AST) -> bool:
        """A fresh value built from literals (safe builtins called on them included): nothing the program
        defines or returns (whose attributes may reach frames and namespaces), no function or generator of
        the expression, no bare builtin (``list.append(x, 1)`` would change any object ``x``)."""
        if isinstance(node, ast.Name):
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (sub.id not in SAFE_BUILTINS or sub.id in self.callables):
                return False
            if isinstance(sub, (ast.Lambda, ast.NamedExpr, *_COMPREHENSIONS)):
                return False
        return True

    def callee(self, func: ast.expr) -> None:
        """Official parse mode: the tested call may name any function (a dotted name included)."""
        while isinstance(func, ast.Attribute):
            self.attribute_name(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            self.visit(func, frozenset())  # its own code first (a dunder, a walrus ...)
            raise _Refused("attribute")  # a method of what an expression returns
        if _is_dunder(func.id) or func.id in FORBIDDEN_NAMES:
            raise _Refused("dunder" if _is_dunder(func.id) else "forbidden_name")


def expression_reason(
    tree: ast.Expression, callables: frozenset[str], *, any_callee: bool = False, free_names: bool = False
) -> str:
    """``ok`` when the expression contains only what a test's call or answer may contain, else the code
    of the first part that is not (the rule of the module docstring).

    Args:
        tree: The call or answer, parsed with ``mode="eval"`` (NFKC-normalised source).
        callables: Names the expression may use beside :data:`SAFE_BUILTINS`: the entry point.
        any_callee: The outermost call may name any function, dotted names included (``tests.parse_mode:
            official``, where any call is a test); its arguments follow the rule.
        free_names: Any other name may be read too (a predicted answer: its value decides its own test's
            validity only, and a name is never a binding); attributes of such a name stay refused.
    """
    walker, body = _AllowList(callables, free_names), tree.body
    try:
        if any_callee and isinstance(body, ast.Call):
            walker.callee(body.func)
            for part in (*body.args, *body.keywords):
                walker.visit(part, frozenset())
        else:
            walker.visit(body, frozenset())
    except _Refused as refused:
        return refused.code
    except RecursionError:
        return "not_allowed"
    return OK


def replay_reason(tree: ast.Expression) -> str:
    """The rule for a stored Mistake-Book call, whose entry point the book does not keep: the outermost
    call may name any function and other names may be read, and everything else of the rule holds (no
    binding, dunder, forbidden name or attribute of what the program returns). The parser applied the
    whole rule before the test could enter the book; this is what a book read from disk is held to."""
    return expression_reason(tree, frozenset(), any_callee=True, free_names=True)


@functools.lru_cache(maxsize=4096)  # the suites written for one problem repeat calls; the code is pure
def call_reason(call: str, entry_point: str, any_function: bool = False) -> str:
    """Reason code of one call source (``ok`` when acceptable).

    ``any_function`` (``tests.parse_mode: official``, §5.2): any call is a test, as the official parser keeps
    ``assert len(f(x)) == 2``; the strict mode (D5) requires a call of the entry point.
    """
    call, entry_point = unicodedata.normalize("NFKC", call), unicodedata.normalize("NFKC", entry_point)
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "call_syntax"
    body = tree.body
    if not isinstance(body, ast.Call):
        return "not_a_call"
    if not any_function and not (isinstance(body.func, ast.Name) and body.func.id == entry_point):
        return "wrong_function"
    return expression_reason(tree, frozenset({entry_point}), any_callee=any_function)


def answer_reason(answer: str, entry_point: str, literal: bool = True, *, plain: bool = False) -> str:
    """Reason code of one predicted answer; ``literal``: it must be plain data (``tests.literal_answers``).

    ``plain``: :func:`is_plain_literal` already holds for ``answer`` as written (the parser applied it).
    Such an answer names nothing the name checks flag (plain data has no attribute, walrus or other name
    than ``float``, ``set`` and ``frozenset``), so it is acceptable as it is unless NFKC normalisation
    changes it.
    """
    if _SIMPLE_LITERAL.fullmatch(answer):  # fast path: a number, bool, None, plain string or flat int list
        return OK
    normal, normal_ep = unicodedata.normalize("NFKC", answer), unicodedata.normalize("NFKC", entry_point)
    if plain and normal == answer and normal_ep == entry_point:
        return OK
    try:
        tree = ast.parse(normal, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "answer_syntax"
    code = expression_reason(tree, frozenset({normal_ep}), free_names=True)
    names = code if code == OK else "answer_" + code
    if names == OK and literal and not is_plain_literal(normal, normal_ep, tree):
        return "expected_not_literal"
    return names


def suite_checks(
    tests: Sequence[ParsedTest],
    entry_point: str,
    *,
    any_function: bool,
    literal: bool,
    plain_answers: bool = False,
) -> tuple[str, ...]:
    """The reason code of every test of one suite, in order (``ok`` when acceptable).

    A test's code is the first that applies of :func:`call_reason`, :func:`answer_reason` and ``duplicate``:
    the same call source (stripped; the parser's calls come ``ast.unparse``-normalized, so equal source is
    the same call) as an earlier test of the suite whose call is acceptable.

    Args:
        tests: One suite's tests in document order.
        entry_point: Name of the function under test.
        any_function: ``tests.parse_mode: official``: a call of any function is a test (:func:`call_reason`).
        literal: ``tests.literal_answers``.
        plain_answers: Every answer already passed :func:`is_plain_literal` (``answer_reason``'s ``plain``).
    """
    codes: list[str] = []
    calls_ok: set[str] = set()
    for test in tests:
        call = test.call.strip()
        code = call_reason(call, entry_point, any_function)
        if code == OK:
            code = answer_reason(test.answer.strip(), entry_point, literal, plain=plain_answers)
            if code == OK and call in calls_ok:
                code = DUPLICATE
            calls_ok.add(call)
        codes.append(code)
    return tuple(codes)
