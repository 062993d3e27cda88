"""The prepare stage's expected-value cache is checksummed and keyed by what produced it.

Before: ``data/cache/expected`` was trusted blindly (neither a DVC dependency nor checksummed): edited entries
gave exit 0, "cache hits: 330" and 330 golden tests silently excluded; and an entry computed by an older sandbox
was reused after the sandbox changed. Now an entry whose checksum or key does not match is recomputed with one
warning line naming it, and the key includes the sandbox's version (a hash of its sources).
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from codea1_core.config import Config


def _values(outcomes: list) -> list:
    return [[(o.status, o.value) for o in row] for row in outcomes]


def _cfg(tmp_path: Path) -> Config:
    return Config().replace(**{"data.prepared_dir": str(tmp_path / "prepared"), "lab.heldout_per_family": 1})


def test_an_edited_cache_entry_is_recomputed_with_a_warning(tmp_path: Path, caplog) -> None:
    import flows.prepare as prepare
    from codea1_core.data.lab import lab_problems
    from codea1_core.values import encode

    cfg = _cfg(tmp_path)
    problems = lab_problems(cfg.lab, "val")[:2]
    cache = tmp_path / "cache"
    first: dict = {}
    truth = prepare._run_references(cfg, problems, cache, first)
    assert first["cache_hits"] == 0 and first["sandbox_programs"] >= 2
    entry = sorted(cache.glob("*.json"))[0]
    data = json.loads(entry.read_text())
    data["outcomes"][0] = ["ok", base64.b64encode(encode("edited")).decode(), ""]  # valid, but not what ran
    entry.write_text(json.dumps(data))
    again: dict = {}
    prepare.log.addHandler(caplog.handler)  # the stage's own logger (its console set-up may not propagate)
    try:
        second = prepare._run_references(cfg, problems, cache, again)
    finally:
        prepare.log.removeHandler(caplog.handler)
    assert again["sandbox_programs"] == 1 and again["cache_hits"] == first["sandbox_programs"] - 1
    assert _values(second) == _values(truth)
    records = {
        id(r): r for r in caplog.records
    }.values()  # one record seen twice when the logger also propagates
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(entry) in warnings[0] and "recomputed" in warnings[0], warnings


def test_the_cache_key_includes_the_sandbox_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flows.prepare as prepare
    from codea1_core.data.lab import lab_problems

    cfg = _cfg(tmp_path)
    problems = lab_problems(cfg.lab, "val")[:1]
    cache = tmp_path / "cache"
    prepare._run_references(cfg, problems, cache, {})
    assert len(prepare.sandbox_version()) == 16
    monkeypatch.setattr(prepare, "sandbox_version", lambda: "another-sandbox!")
    report: dict = {}
    prepare._run_references(cfg, problems, cache, report)
    assert report["cache_hits"] == 0 and report["sandbox_programs"] >= 1


def test_references_run_under_their_own_memory_limit_and_the_cache_is_keyed_by_it(tmp_path: Path) -> None:
    """Before: prepare ran references under the samples' ``sandbox.memory_mb`` (1 GiB): an input whose expected
    output needs more was dropped as ``reference_memory``. Now references get ``data.reference_memory_mb``
    (EvalPlus' 4 GiB by default), and the cache key includes it: an entry computed under another limit is not
    reused."""
    from support import problem

    import flows.prepare as prepare

    heavy = problem(
        "t/heavy",
        "big",
        tests=(("big(1536, 0)", None),),
        plus=(("big(1, 1)", None),),
        reference="def big(a, b):\n    return len(bytearray(a * 2**20)) + b\n",
    )
    cache = tmp_path / "cache"
    cfg = _cfg(tmp_path).replace(**{"sandbox.memory_mb": 1024})  # the samples' limit stays 1 GiB
    assert cfg.data.reference_memory_mb == 4096
    report: dict = {}
    (ran,) = prepare._run_references(cfg, [heavy], cache, report)
    assert [(o.status, o.value) for o in ran] == [("ok", 1536 * 2**20), ("ok", 2**20 + 1)], ran
    tight: dict = {}
    (under_1g,) = prepare._run_references(
        cfg.replace(**{"data.reference_memory_mb": 1024}), [heavy], cache, tight
    )
    assert tight["cache_hits"] == 0, "an entry computed under another memory limit was reused"
    assert [o.status for o in under_1g] == ["memory", "ok"], under_1g
