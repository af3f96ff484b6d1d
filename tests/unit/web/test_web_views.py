"""Rates from ever-growing counters: samples taken on reads, bounded per key."""

from __future__ import annotations

from mqserver.web.views import RateSampler


def test_rates_over_the_window_from_read_time_samples():
    sampler = RateSampler(window=10.0, interval=1.0)
    assert sampler.rates("q", (0, 0), 0.0) == [0.0, 0.0]
    assert sampler.rates("q", (10, 5), 0.5) == [20.0, 10.0]  # too soon for a new sample
    for t in range(1, 30):
        sampler.rates("q", (t * 100, 0), float(t))
    # the baseline is the newest sample at least a window old: t = 19
    assert sampler.rates("q", (3000, 0), 30.0) == [100.0, 0.0]
    assert len(sampler._samples["q"]) <= 12


def test_counters_that_restart_never_give_negative_rates_and_gone_keys_are_forgotten():
    sampler = RateSampler()
    sampler.rates("q", (100,), 0.0)
    assert sampler.rates("q", (3,), 2.0) == [0.0]
    sampler.rates("other", (1,), 2.0)
    sampler.keep_only({"other"})
    assert set(sampler._samples) == {"other"}
