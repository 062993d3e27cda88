"""Benchmark evaluation, pure parts: jobs, verdicts and aggregation, metrics of both roles, mutants,
external benchmark adapters, the HTML report and the lab comparison's numbers.
"""
