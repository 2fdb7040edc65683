"""Benchmarks of fleet-tui against fixed budgets: `python -m bench` writes bench/RESULTS.md.

Each module `bench/<name>.py` has `run(smoke=False, runs=None) -> BenchResult`; smoke mode
uses tiny sizes so tests/project/test_bench_smoke.py can keep every benchmark working.
"""
