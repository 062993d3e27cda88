"""Benchmark evaluation, pure parts: jobs, verdicts and aggregation (``verdicts``), the Test-LLM two-phase
plan (``suites``), test-time collaboration (``solve``) and ``attack`` plans, metrics of both roles, mutants,
external benchmark adapters and benchmarks by name, the HTML report and the lab comparison's numbers.
"""
