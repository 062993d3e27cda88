"""Data: the sha256 sums published in the data folder's README are checked.

Before, a modified benchmark file that still parsed was read without a word (every evaluation number
silently changed); the README's sums were never looked at.
"""

from __future__ import annotations

import gzip
import shutil

import pytest

from codea1_core.config import Config
from codea1_core.data.dataset_types import DatasetError
from codea1_core.data.datasets import load_source


def _copy(shared_data_dir, tmp_path):
    data = tmp_path / "data"
    (data / "humanevalplus").mkdir(parents=True)
    src = next((shared_data_dir / "humanevalplus").glob("HumanEvalPlus-*.jsonl*"))
    shutil.copy(src, data / "humanevalplus" / src.name)
    shutil.copy(shared_data_dir / "README.md", data / "README.md")
    return data, data / "humanevalplus" / src.name


def test_the_shipped_files_match_their_published_sums(shared_data_dir):
    assert len(load_source("humanevalplus", "test", Config(), shared_data_dir)) == 164


def test_a_modified_file_that_still_parses_is_refused_naming_it(shared_data_dir, tmp_path):
    data, path = _copy(shared_data_dir, tmp_path)
    rows = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(rows[:-1])))  # one problem fewer: valid JSONL, wrong data
    with pytest.raises(DatasetError, match=rf"{path}: sha256 .* differs from .* published in .*README.md"):
        load_source("humanevalplus", "test", Config(), data)


def test_files_the_readme_does_not_list_are_not_checked(shared_data_dir, tmp_path):
    data, path = _copy(shared_data_dir, tmp_path)
    (data / "README.md").write_text("no sums here\n")
    assert len(load_source("humanevalplus", "test", Config(), data)) == 164
