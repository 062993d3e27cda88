"""The Code-A1 core, pure: config, values, types and atomic writes, and the data, method, evaluation and
models sub-packages (no orchestration, tracking, data-versioning or sandbox imports:
``tests/core/test_core_purity.py``).
"""
