"""The register stage's task: judge one role's new version against its champion and its warm start.

What it does: :func:`judge` (task run ``judge[<role>]``) reads the role's current ``champion`` from the
registry, applies :func:`decide` (``champion`` only when the new number strictly beats the current champion,
or there is none, and the role's own warm start, when it was evaluated; else ``candidate``), sets the alias
and tags the version with the numbers and the reason.
What it does not: read the evaluation or choose the versions and metrics (``flows/register.py`` does).

Tests: ``pytest tests/flows/test_register.py``.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config
from tracking.registry import MODEL_NAMES, alias_info, set_alias

TAG = "eval.promote_value"
"""The version tag holding the number it was judged on (what a later version must beat)."""


def decide(new: float, champion: float | None, warmstart: float | None = None) -> tuple[str, str]:
    """``(alias, reason)``: ``champion`` only when the new number strictly beats the current champion (or there
    is none) and the role's own warm start (when it was evaluated); else ``candidate``."""
    if warmstart is not None and not new > warmstart:
        return "candidate", f"{new:.4g} does not beat its warm start {warmstart:.4g}"
    if champion is not None and not new > champion:
        return "candidate", f"{new:.4g} does not beat the champion {champion:.4g}"
    beaten = [
        f"{name} {v:.4g}" for name, v in (("champion", champion), ("warm start", warmstart)) if v is not None
    ]
    return "champion", f"{new:.4g} beats " + (" and ".join(beaten) if beaten else "nothing (first version)")


@task(name="judge", task_run_name="judge[{role}]", cache_policy=NO_CACHE)
def judge(
    cfg: Config, role: str, version: str, metric: str, new: float, warm: float | None
) -> dict[str, Any]:
    """Compare one role's version on its own metric (``new``; ``warm``: its warm start's, None when not
    evaluated); set the alias and tag the version with the numbers (a task run of the register flow)."""
    name = MODEL_NAMES[role]
    current = alias_info(cfg, name, "champion")
    champ = float(current["tags"][TAG]) if current and TAG in current["tags"] else None
    if current and current["version"] == version:
        champ = None  # re-running register on the same version: judge it against its warm start only
    alias, reason = decide(new, champ, warm)
    tags = {TAG: repr(new), "eval.promote_metric": metric, "register.decision": f"{alias}: {reason}"}
    set_alias(cfg, name, version, alias, tags)
    return {
        "version": version,
        "metric": metric,
        "new": new,
        "champion_value": champ,
        "warmstart_value": warm,
        "alias": alias,
        "reason": reason,
    }
