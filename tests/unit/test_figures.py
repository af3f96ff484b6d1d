"""Figure: numbers kept in an array, read back as what they are."""

from __future__ import annotations

import sys

from mqserver.figures import Figure, figures


class Counter:
    count = Figure(int)
    seconds = Figure(float)

    def __init__(self) -> None:
        self.figures = figures(Counter)


def test_figures_start_at_zero_and_read_back_as_their_kind():
    counter = Counter()
    assert (counter.count, counter.seconds) == (0, 0.0)
    assert type(counter.count) is int and type(counter.seconds) is float
    counter.count += 1_000_001
    counter.seconds += 0.25
    counter.seconds += 0.5
    assert (counter.count, counter.seconds) == (1_000_001, 0.75)
    assert type(counter.count) is int


def test_each_instance_has_its_own():
    one, two = Counter(), Counter()
    one.count = 3
    assert (one.count, two.count) == (3, 0)
    assert list(one.figures) == [3.0, 0.0]


def test_a_figure_keeps_no_object_of_its_value():
    counter = Counter()
    value = 10**6 + 7
    alone = sys.getrefcount(value)
    counter.count = value
    assert sys.getrefcount(value) == alone


def test_the_class_attribute_is_the_descriptor():
    assert isinstance(Counter.count, Figure) and Counter.seconds.index == 1
