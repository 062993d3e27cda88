"""The shared GX context (gates.gx): one per process, a validation definition per name, positions per code."""

from __future__ import annotations

import pandas as pd

from gates.gx import gx_context


def test_one_context_runs_expectations_and_keeps_each_definition():
    ctx = gx_context()
    assert gx_context() is ctx
    e = ctx.gx.expectations
    expectations = [
        ("null_x", e.ExpectColumnValuesToNotBeNull(column="x")),
        ("big_y", e.ExpectColumnValuesToBeBetween(column="y", max_value=2)),
    ]
    frame = pd.DataFrame({"x": ["a", None, "c", None], "y": [1, 2, 3, 0]}).astype(object)
    frame = frame.where(frame.notna(), None)
    assert ctx.run("gx-test", expectations, frame) == {"null_x": [1, 3], "big_y": [2]}
    definition = ctx.definitions["gx-test"]
    clean = pd.DataFrame({"x": ["a"], "y": [0]})
    assert ctx.run("gx-test", expectations, clean) == {"null_x": [], "big_y": []}
    assert ctx.definitions["gx-test"] is definition
