"""Every citation in the code resolves inside the repository.

The code cites its specification as ``§N`` / ``§N.M`` (a part of the method), ``D<n>`` (a decision of ours) and
``quirk N`` (a defect of the official implementation); each must name a heading of ``docs/method.md``. A
reference to a document that is not in the repository (the specification's old home) or to an issue number
is dangling too: a person who clones the repository cannot follow it, so the comment must say the behaviour
it guards instead. Failures name ``file:line`` and what is cited.
"""

from __future__ import annotations

import re
from pathlib import Path

METHOD = Path("docs") / "method.md"
SCANNED_DIRS = ("codea1_core", "sandbox", "tasks", "flows", "bench", "tools", "tests")
"""Python sources scanned (``tools`` when present), plus :data:`SCANNED_FILES`."""
SCANNED_FILES = ("params.yaml", "dvc.yaml", "Makefile", "configs/*.yaml")

_HEADING = re.compile(r"^#{1,6}\s+(§\d+(?:\.\d+)*|D\d+|Quirk \d+)(?=[\s:]|$)", re.M)
_SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
_DECISION = re.compile(r"\bD(\d+)\b")
_DECISION_RANGE = re.compile(r"\bD(\d+)\s*[-–]\s*D(\d+)\b")
_QUIRK = re.compile(r"\bquirks?[\s-]+(\d+(?:(?:\s*,\s*|\s+and\s+|\s*/\s*)\d+)*)", re.I)
_OUTSIDE_DOC = re.compile(r"\b(?:ALGORITHM|ARCHITECTURE|STYLE)\.md\b|shared/docs")
_ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&/#])#\d{1,4}\b(?![\w-])", re.I)


def method_labels(text: str) -> set[str]:
    """The labels of ``docs/method.md``'s headings: ``§7.3``, ``D4``, ``quirk 11``."""
    return {label.lower() for label in _HEADING.findall(text)}


def citations(line: str) -> list[str]:
    """What one line cites, as method labels (``§3``, ``d4``, ``quirk 11``) and other references."""
    found = [f"§{num}" for num in _SECTION.findall(line)]
    found += [f"d{num}" for num in _DECISION.findall(line)]
    for low, high in _DECISION_RANGE.findall(line):  # "D1-D4" cites D2 and D3 too
        found += [f"d{num}" for num in range(int(low) + 1, int(high))]
    for numbers in _QUIRK.findall(line):
        found += [f"quirk {num}" for num in re.findall(r"\d+", numbers)]
    return found


def dangling(path: Path, rel: str, labels: set[str]) -> list[str]:
    """One line per dangling citation of a file: ``rel:line: ...``."""
    problems = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for cited in citations(line):
            if cited not in labels:
                problems.append(f"{rel}:{number}: cites {cited!r}, which no heading of {METHOD} carries")
        for ref in _OUTSIDE_DOC.findall(line):
            problems.append(f"{rel}:{number}: cites {ref!r}, which is not in the repository (use {METHOD})")
        for ref in _ISSUE.findall(line):
            problems.append(f"{rel}:{number}: names {ref!r}: say the behaviour it guards instead")
    return problems


def scanned(repo: Path) -> list[Path]:
    """The files whose citations must resolve (this test excepted: it spells the patterns out)."""
    files = [p for d in SCANNED_DIRS if (repo / d).is_dir() for p in sorted((repo / d).rglob("*.py"))]
    files += [p for pattern in SCANNED_FILES for p in sorted(repo.glob(pattern))]
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def check(repo: Path) -> list[str]:
    labels = method_labels((repo / METHOD).read_text())
    return [
        msg for path in scanned(repo) for msg in dangling(path, path.relative_to(repo).as_posix(), labels)
    ]


def test_every_citation_in_the_code_resolves(repo_root: Path) -> None:
    problems = check(repo_root)
    assert not problems, f"{len(problems)} dangling citation(s):\n" + "\n".join(problems)


def test_the_method_has_the_labels_the_code_cites_most(repo_root: Path) -> None:
    text = (repo_root / METHOD).read_text()
    labels = method_labels(text)
    every = [label.lower() for label in _HEADING.findall(text)]
    assert len(every) == len(labels), (
        f"a label names two headings: {sorted(x for x in labels if every.count(x) > 1)}"
    )
    assert {"§3", "§5.2", "§7.3", "§8", "§10", "§19", "d1", "d4", "d10", "quirk 11"} <= labels
    assert len(scanned(repo_root)) > 100  # the scan really walks the code


def test_a_dangling_citation_fails_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / METHOD).write_text(
        "# M\n## §7 Rewards\n### §7.3 Test LLM reward\n### D4 Infra\n### Quirk 11 X\n"
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "ok.py").write_text(
        '"""Test reward (§7.3, D4, quirk 11; §7), docs/method.md."""\ncolor = "#1f77b4"  # a colour, not an issue\n'
    )
    (tmp_path / "tasks" / "bad.py").write_text(
        "x = 1\n"
        "# see §7.9 and D12 (quirks 11 and 3)\n"
        '"""Guards the bug of issue 17, see #20 and ALGORITHM.md."""\n'
        "# D1-D4\n"
    )
    problems = check(tmp_path)
    assert all(p.startswith("tasks/bad.py:") for p in problems), problems
    joined = "\n".join(problems)
    for needle in [
        "bad.py:2: cites '§7.9'",
        "bad.py:2: cites 'd12'",
        "bad.py:2: cites 'quirk 3'",
        "bad.py:3: names 'issue 17'",
        "bad.py:3: names '#20'",
        "bad.py:3: cites 'ALGORITHM.md'",
        "bad.py:4: cites 'd1'",
        "bad.py:4: cites 'd2'",
    ]:
        assert needle in joined, joined
    assert "quirk 11" not in joined and "cites 'd4'" not in joined
