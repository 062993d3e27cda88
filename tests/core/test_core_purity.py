"""Core is pure: no module of ``codea1_core/`` imports orchestration, tracking (MLflow or this project's
``tracking`` package), the training workspace (``workspace``), data-versioning, data-validation (GX or this
project's ``gates`` package), process-spawning or sandbox code.

Every import statement counts, including ones inside functions and ``importlib.import_module("x")`` /
``__import__("x")`` calls with a literal name. Allowed are torch, transformers, peft, trl, tokenizers,
datasets, numpy, pandas, pyarrow, yaml, cosmic_ray, parso and the standard library (minus subprocess).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BANNED = frozenset(
    {
        "prefect",
        "mlflow",
        "dvc",
        "great_expectations",
        "subprocess",
        "sandbox",
        "tracking",
        "workspace",
        "gates",
    }
)
CORE = Path(__file__).resolve().parents[2] / "codea1_core"


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in ``tree``, wherever it sits."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def banned_imports(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: name`` for every banned import in ``source``."""
    tree = ast.parse(source, filename=filename)
    return [
        f"{filename}:{line}: {name}" for line, name in _imported_names(tree) if name.split(".")[0] in BANNED
    ]


def _core_modules() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts)


def test_core_modules_import_nothing_banned():
    modules = _core_modules()
    assert len(modules) >= 3, f"expected the core package at {CORE}"
    problems = [
        hit
        for path in modules
        for hit in banned_imports(path.read_text("utf-8"), str(path.relative_to(CORE.parent)))
    ]
    assert problems == [], "codea1_core must stay pure:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("import prefect\n", "prefect"),
        ("from mlflow.tracking import MlflowClient\n", "mlflow.tracking"),
        ("import os, dvc.api as d\n", "dvc.api"),
        ("def f():\n    import subprocess\n    return subprocess\n", "subprocess"),
        ("class A:\n    def m(self):\n        from great_expectations import core\n", "great_expectations"),
        ("from sandbox.executor import ProcessExecutor\n", "sandbox.executor"),
        ("def f():\n    from tracking.store import client\n", "tracking.store"),
        ("import workspace.lock\n", "workspace.lock"),
        ("def f():\n    from gates.gx import gx_context\n", "gates.gx"),
        ("import importlib\nmod = importlib.import_module('prefect.flows')\n", "prefect.flows"),
        ("x = __import__('subprocess')\n", "subprocess"),
        ("try:\n    import mlflow\nexcept ImportError:\n    mlflow = None\n", "mlflow"),
    ],
)
def test_checker_flags_a_synthetic_bad_module(source, name):
    hits = banned_imports(source, "bad.py")
    assert len(hits) == 1 and hits[0].endswith(f": {name}"), hits


def test_checker_accepts_allowed_imports():
    source = (
        "import torch, numpy as np, yaml\nfrom transformers import AutoModel\nfrom peft import LoraConfig\n"
        "import cosmic_ray.mutating, parso\nfrom codea1_core import values\nfrom . import types\n"
        "import subprocess_tools_not_really\nfrom os import path\n"
    )
    assert banned_imports(source) == []
