"""The training workspace on disk (``orchestration.checkpoint_dir``): checkpoints, resume, the lock.

One concept per module: :mod:`workspace.checkpoints` (atomic, verified iteration checkpoints),
:mod:`workspace.resume` (where a run starts, what it records about itself, its history files),
:mod:`workspace.lock` (one training run per workspace). The Prefect task that writes a checkpoint is
``tasks/checkpoint.py``.

Layering: above ``codea1_core`` and ``sandbox``, below ``tasks``; nothing here imports ``tracking``.
Tests: ``pytest tests/workspace``.
"""
