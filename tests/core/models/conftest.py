"""Fixtures of the model tests (``codea1_core/models``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The decode tests' tiny model (``DECODE_CORPUS`` tokenizer), built once per module."""
    from support import DECODE_CORPUS

    from codea1_core.models.tiny_model import build_tiny_model

    return str(
        build_tiny_model(tmp_path_factory.mktemp("fast") / "model", DECODE_CORPUS, vocab_size=400, seed=0)
    )
