"""The parts of ``benchmarks/bench_learning.py``: process trees, the contenders, the evaluator, the report."""
