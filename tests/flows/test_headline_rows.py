"""The headline file (`dvc metrics show`) keeps mut@k and mut@k_all apart.

Regression: with both ``test/<src>/mut@5`` and ``test/<src>/mut@5_all`` in the metrics, the ``mut`` row was
written from one, then overwritten by the other, so ``dvc metrics show``'s ``mut`` was mut@5_all, not the
mut@5 the README and the learning table mean.
"""

from __future__ import annotations

from flows.summary import headline

PROMOTE = "code/lab_heldout_seen/base/pass@1"


def test_mut_row_is_mut_at_k_and_mut_all_has_its_own_row() -> None:
    metrics = {PROMOTE: 58.5, f"warmstart/{PROMOTE}": 45.4, f"delta/{PROMOTE}": 13.1}
    for key, (warm, trained) in {
        "pass@5": (23.5, 29.7),
        "mut@5": (40.6, 36.1),
        "mut@5_all": (1.3, 2.4),
    }.items():
        full = f"test/lab_heldout/{key}"
        metrics |= {full: trained, f"warmstart/{full}": warm, f"delta/{full}": round(trained - warm, 1)}
    top = headline(metrics, PROMOTE)
    assert top["mut"] == {"warm": 40.6, "trained": 36.1, "delta": -4.5}
    assert top["mut_all"] == {"warm": 1.3, "trained": 2.4, "delta": 1.1}
    assert top["test"] == {"warm": 23.5, "trained": 29.7, "delta": 6.2}


def test_mut_row_without_baseline() -> None:
    top = headline(
        {PROMOTE: 30.0, "test/lab_heldout/mut@5": 36.0, "test/lab_heldout/mut@5_all": 2.0}, PROMOTE
    )
    assert top["mut"] == {"trained": 36.0} and top["mut_all"] == {"trained": 2.0}
