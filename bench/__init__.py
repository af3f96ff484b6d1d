"""Benchmarks (see docs/performance.md); run as ``python -m bench.<name>``."""
