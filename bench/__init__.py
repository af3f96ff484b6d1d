"""Benchmarks (see docs/performance.md): ``python -m bench`` is the suite with
its peers; ``python -m bench.mqks_w1`` (W1 over MQKS, ``--compare-journal``)
and ``python -m bench.crash_soak`` are single-purpose tools."""
