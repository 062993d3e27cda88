"""Fixtures the tracking tests share: ``cfg``, a default Config on a fresh sqlite store (``mlflow_cfg``)."""

from __future__ import annotations

import pytest

from codea1_core.config import Config


@pytest.fixture()
def cfg(mlflow_cfg: Config) -> Config:
    return mlflow_cfg
