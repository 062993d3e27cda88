"""Data-quality gates on Great Expectations: the only package that imports great_expectations.

One concept per module: :mod:`gates.gx` (one ephemeral GX context, shared by every thread, that runs a
list of expectations over a frame), :mod:`gates.errors` (:class:`~gates.errors.DataQualityError`, what a
failed gate raises), :mod:`gates.problems` (the prepared-problem gate) and :mod:`gates.generated_tests` (the
generated-test gate: its columns, expectations and :class:`~gates.generated_tests.GateResult`). The Prefect
tasks that run the gates are ``tasks/quality.py``.

Layering: above ``codea1_core`` and ``sandbox``, below ``tasks``; nothing here imports ``tracking`` or
``workspace``. Tests: ``pytest tests/gates``.
"""
