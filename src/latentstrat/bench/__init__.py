"""Benchmarks against naive baselines: `python -m latentstrat.bench train|decode`."""
