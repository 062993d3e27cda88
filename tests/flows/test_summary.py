"""The headline metrics file: the learning table's numbers in a few short columns (`dvc metrics show`)."""

from __future__ import annotations

from flows.summary import headline

PROMOTE = "code/lab_heldout_seen/base/pass@1"


def test_headline_rows_are_the_learning_table() -> None:
    metrics = {
        PROMOTE: 34.5,
        f"warmstart/{PROMOTE}": 23.7,
        f"delta/{PROMOTE}": 10.8,
        "test/lab_heldout/pass@5": 22.4,
        "warmstart/test/lab_heldout/pass@5": 14.0,
        "delta/test/lab_heldout/pass@5": 8.4,
        "test/lab_heldout/mut@5": 38.5,
        "warmstart/test/lab_heldout/mut@5": 0.0,
        "delta/test/lab_heldout/mut@5": 38.5,
        "test/lab_heldout/pass@5_ult": 9.0,
        "delta/test/lab_heldout/pass@5_ult": 1.0,
        "code/lab_heldout/base/avg@8": 30.0,
    }
    top = headline(metrics, PROMOTE)
    assert top == {
        "code": {"warm": 23.7, "trained": 34.5, "delta": 10.8},
        "mut": {"warm": 0.0, "trained": 38.5, "delta": 38.5},
        "test": {"warm": 14.0, "trained": 22.4, "delta": 8.4},
    }


def test_headline_without_baseline_keeps_trained_numbers() -> None:
    top = headline({PROMOTE: 30.0, "test/lab_heldout/pass@5": 20.0}, PROMOTE)
    assert top == {"code": {"trained": 30.0}, "test": {"trained": 20.0}}


def test_progress_line_format() -> None:
    """Regression: training printed no step counter, rewards or ETA."""
    from flows.console import progress_line

    history = [{"time/iteration_s": 5.0}, {"time/iteration_s": 5.2}]
    row = {"code/reward_mean": 0.712, "test/reward_mean": 0.17, "mistake_book/size": 412.0}
    assert (
        progress_line(5, 95, row, history) == "it 5/95  code_r .71  test_r .17  MB 412  5.1 s/it  ETA 8 min"
    )
    golden = progress_line(94, 95, {"code/reward_mean": 1.0}, history)
    assert golden == "it 94/95  code_r 1.00  5.1 s/it  ETA 5 s"
