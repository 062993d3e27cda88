"""Experiment tracking on MLflow: the only package that imports mlflow.

One concept per module: :mod:`tracking.store` (where the store is, a client, the probe before any work),
:mod:`tracking.runs` (the training run's tracker and its null stand-in), :mod:`tracking.results` (what the
evaluate and register stages log, links to runs), :mod:`tracking.packaging` (a trained model as an MLflow
``transformers`` model with a chat flavour), :mod:`tracking.registry` (registered versions, aliases, the
models ``solve`` / ``attack`` download). The Prefect task that logs an iteration is ``tasks/tracking.py``.

Layering: above ``codea1_core`` and ``sandbox``, below ``tasks``; nothing here imports ``workspace``.
Tests: ``pytest tests/tracking``.
"""
