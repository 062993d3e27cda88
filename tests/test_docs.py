"""Every repository path the documents name exists (or is something a run creates).

Scanned: ``README.md`` and ``docs/*.md``. Checked in each, outside fenced code blocks:

* every whitespace-separated token of an inline code span (a ``backticked`` word, or a word of a backticked
  command) that is a **repo path**: it contains a ``/`` and its first component names an entry of the repository's
  top level (``flows/train.py``, ``docs/method.md``, ``sandbox/``, ``outputs/eval/metrics.json``,
  ``configs/*.yaml``). A token without a ``/``, or whose first component is not at the top (``cpu_decode/engine.py``,
  ``http://...``, ``sqlite:///...``), is not checked. ``key=PATH`` is read as ``PATH``; a ``::name`` or ``:line``
  suffix is dropped; ``{a,b}`` is expanded; ``<placeholder>`` and ``*`` match any name (at least one file must);
* every relative markdown link target (``[guide](docs/guide.md)``, ``[method.md](method.md)``), resolved from the
  document's folder.

A path a run creates cannot exist in a clean clone, so these count as existing without being there: a path
**git ignores** (the ``.gitignore`` files of the repository: ``outputs/`` but its versioned metrics, ``mlflow/``'s
store, ``data/cache/``, ``runs/``, ``.venv/``) and a path under a **DVC output** declared in ``dvc.yaml``
(``outs``, ``metrics``, ``plots``) that lives in the DVC cache. A file git versions (``outputs/eval/metrics.json``,
a ``cache: false`` output) must exist.
Failures name ``file:line`` and the path.

How to run: ``pytest tests/test_docs.py`` (reads files, a second).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DOCS = ("README.md", "docs/*.md")
"""The documents scanned, as globs from the repository root."""

_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BRACES = re.compile(r"\{([^{}]*)\}")
_PLACEHOLDER = re.compile(r"<[^<>/]*>")
_SUFFIX = re.compile(r"::?\w+$")


def _glob_regex(pattern: str) -> str:
    """A gitignore glob as a regex over one path: ``*`` and ``?`` stay within a component, ``**`` does not."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def ignore_rules(repo: Path) -> list[tuple[str, re.Pattern[str], bool, bool]]:
    """The rules of every ``.gitignore`` (outside ``.venv``), in git's order of precedence (deeper files last):
    ``(folder of the file, pattern, negated, directories only)``."""
    rules = []
    files = [p for p in repo.rglob(".gitignore") if ".venv" not in p.relative_to(repo).parts]
    for path in sorted(files, key=lambda p: len(p.relative_to(repo).parts)):
        base = path.parent.relative_to(repo).as_posix()
        base = "" if base == "." else base
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line.lstrip("!")
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            regex = _glob_regex(line.lstrip("/"))
            regex = regex if anchored else f"(?:.*/)?{regex}"  # an unanchored name matches at any depth
            rules.append((base, re.compile(regex), negated, dir_only))
    return rules


def ignored(rel: str, rules: list[tuple[str, re.Pattern[str], bool, bool]]) -> bool:
    """Whether git ignores ``rel`` (a path from the repository root): the last matching rule decides for each
    folder on the way down, and nothing under an ignored folder can be let through again (git's rule)."""
    parts = rel.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        sub = "/".join(parts[:depth])
        # a folder: above the last component, or the last one written with a trailing / or without a suffix
        is_dir = depth < len(parts) or rel.endswith("/") or "." not in parts[-1]
        state = False
        for base, regex, negated, dir_only in rules:
            if base and not sub.startswith(base + "/"):
                continue
            local = sub[len(base) + 1 :] if base else sub
            if (is_dir or not dir_only) and regex.fullmatch(local):
                state = not negated
        if state:
            return True
    return False


def dvc_outputs(repo: Path) -> set[str]:
    """The paths ``dvc.yaml``'s stages write into the DVC cache (``outs``, ``metrics``, ``plots``); those marked
    ``cache: false`` are versioned by git instead, so they are not among them."""
    path = repo / "dvc.yaml"
    if not path.is_file():
        return set()
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    found = set()
    for stage in stages.values():
        for key in ("outs", "metrics", "plots"):
            for entry in stage.get(key, []):
                items = entry.items() if isinstance(entry, dict) else [(entry, {})]
                found |= {out.rstrip("/") for out, opts in items if (opts or {}).get("cache", True)}
    return found


def _expand(token: str) -> list[str]:
    match = _BRACES.search(token)
    if not match:
        return [token]
    return [
        variant
        for choice in match.group(1).split(",")
        for variant in _expand(token[: match.start()] + choice + token[match.end() :])
    ]


def repo_paths(line: str, top: set[str]) -> list[str]:
    """The repo paths one line names in inline code spans (see the module docstring)."""
    found = []
    for span in _SPAN.findall(line):
        for word in span.split():
            word = word.strip("'\"(),;").split("=")[-1]
            word = _SUFFIX.sub("", word)
            if "/" in word and word.split("/")[0] in top:
                found.append(word)
    return found


def link_targets(line: str) -> list[str]:
    """The relative link targets of one line (URLs and in-page anchors left out)."""
    targets = []
    for target in _LINK.findall(line):
        target = target.split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            targets.append(target)
    return targets


class Repo:
    """What a document's path is checked against: the files, what git ignores, what DVC writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rules = ignore_rules(root)
        self.outputs = dvc_outputs(root)
        self.top = {p.name for p in root.iterdir()} | {p.split("/")[0] for p in self.outputs}

    def created_by_a_run(self, rel: str) -> bool:
        bare = rel.rstrip("/")
        under_output = any(bare == out or bare.startswith(out + "/") for out in self.outputs)
        return under_output or ignored(rel, self.rules)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` (from the root; globs and placeholders allowed) names something that is there or that
        a run creates."""
        for variant in _expand(rel.removeprefix("./")):
            pattern = _PLACEHOLDER.sub("*", variant).rstrip("/")
            if "*" in pattern:
                if any(True for _ in self.root.glob(pattern)):
                    continue
                if self.created_by_a_run(pattern.replace("*", "x")):
                    continue
                return False
            if not (self.root / pattern).exists() and not self.created_by_a_run(variant):
                return False
        return True


def documents(root: Path) -> list[Path]:
    return [p for pattern in DOCS for p in sorted(root.glob(pattern))]


def dangling(doc: Path, repo: Repo) -> tuple[list[str], int]:
    """One line per path of ``doc`` that does not exist (``rel:line: ...``), and how many paths were checked."""
    rel = doc.relative_to(repo.root).as_posix()
    problems, checked, fenced = [], 0, False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for path in repo_paths(line, repo.top):
            checked += 1
            if not repo.exists(path):
                problems.append(f"{rel}:{number}: names `{path}`, which is not in the repository")
        for target in link_targets(line):
            checked += 1
            resolved = (doc.parent / target).resolve()
            inside = resolved.is_relative_to(repo.root.resolve())
            if not inside or not repo.exists(resolved.relative_to(repo.root.resolve()).as_posix()):
                problems.append(f"{rel}:{number}: links to {target}, which is not in the repository")
    return problems, checked


def check(root: Path) -> tuple[list[str], int]:
    repo = Repo(root)
    problems, checked = [], 0
    for doc in documents(root):
        found, count = dangling(doc, repo)
        problems += found
        checked += count
    return problems, checked


def test_every_path_the_docs_name_exists(repo_root: Path) -> None:
    problems, _ = check(repo_root)
    assert not problems, f"{len(problems)} dangling path(s):\n" + "\n".join(problems)


def test_the_scan_really_reads_the_docs(repo_root: Path) -> None:
    _, checked = check(repo_root)
    assert len(documents(repo_root)) >= 5 and checked > 100, checked
    repo = Repo(repo_root)
    assert repo.created_by_a_run("outputs/eval/report.html") and repo.created_by_a_run("mlflow/mlflow.db")
    assert not repo.created_by_a_run("outputs/eval/metrics.json")  # versioned: must exist
    assert not repo.created_by_a_run("codea1_core/method/loop.py")


def test_a_dangling_path_fails_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "train.py").write_text("")
    (tmp_path / "outputs" / "eval").mkdir(parents=True)
    (tmp_path / "outputs" / "eval" / "metrics.json").write_text("{}")
    (tmp_path / ".gitignore").write_text(
        "/outputs/*\n!/outputs/eval/\n/outputs/eval/*\n!/outputs/eval/metrics.json\n!/outputs/eval/headline.json\n"
    )
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - data/prepared\n      - flows/x.json:\n          cache: false\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n"
        "See `flows/train.py`, `python -m flows.train`, `outputs/eval/metrics.json` and [the readme](../README.md).\n"
        "Runs write `outputs/eval/report.html`, `outputs/numerics/<stage>.json` and `data/prepared/lab.json`.\n"
        "```\ncat flows/gone.py\n```\n"
        "Not paths: `cpu_decode/engine.py`, `sqlite:///mlflow/x.db`, `a/b`.\n"
    )
    (tmp_path / "README.md").write_text(
        "# R\n"
        "`flows/loop.py` and `python flows/solve.py::main`, `flows/x.json`\n"
        "Params: `codea1 train --params=flows/{train,eval}.py`, `outputs/eval/headline.json`.\n"
        "[guide](docs/guide.md), [gone](docs/gone.md), [web](https://example.org/x.md)\n"
    )
    problems, checked = check(tmp_path)
    assert all(p.startswith("README.md:") for p in problems), problems
    assert problems == [
        "README.md:2: names `flows/loop.py`, which is not in the repository",
        "README.md:2: names `flows/solve.py`, which is not in the repository",
        "README.md:2: names `flows/x.json`, which is not in the repository",
        "README.md:3: names `flows/{train,eval}.py`, which is not in the repository",
        "README.md:3: names `outputs/eval/headline.json`, which is not in the repository",
        "README.md:4: links to docs/gone.md, which is not in the repository",
    ], problems
    assert checked == 13  # 7 in docs/guide.md (the fenced block and the non-paths left out), 6 in README.md
