"""The lines about a store's writer far behind: one at once, then one per quiet spell."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from mqserver.broker.behind_log import BehindLog


@pytest.fixture
def lines() -> Any:
    found: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "mqserver.broker.behind_log":
            from twisted.logger import formatEvent

            found.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield found
    globalLogPublisher.removeObserver(observe)


class Writer:
    """What the broker's flow tells the log: the writer's state and two publishers."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.waiting = False
        self.log = BehindLog(self.clock, lambda: (self.waiting, 2), quiet=10.0)

    def change(self, waiting: bool, after: float = 0.0) -> None:
        self.clock.advance(after)
        self.waiting = waiting
        self.log.changed(waiting, 2)


def test_a_single_pause_is_two_lines_at_once_after_a_quiet_spell(lines):
    writer = Writer()
    writer.change(True)
    writer.change(False, after=12.0)
    assert lines == ["storage writes far behind: stopped reading from 2 publishing connections",
                     "storage writes caught up: resumed reading from 2 publishing connections"]


def test_a_flapping_writer_is_summed_up_once_per_quiet_spell(lines):
    writer = Writer()
    writer.change(True)
    for _ in range(24):  # a bulk load: 0.25 s behind, 0.125 s caught up, for 9 s
        writer.change(False, after=0.25)
        writer.change(True, after=0.125)
    assert len(lines) == 1 and writer.clock.getDelayedCalls()
    writer.clock.advance(1.0)  # 10 s after the first line, still behind
    assert lines[1] == ("storage writes still far behind: publishers were paused 24 times in "
                        "the last 10 s, 7.0 s in all; not reading from 2 publishing connections")
    writer.change(False, after=0.5)  # counted again, summed up 10 s after the last line
    writer.clock.advance(9.5)
    assert lines[2] == ("storage writes caught up: publishers were paused 0 times in the last "
                        "10 s, 0.5 s in all; reading from 2 publishing connections")
    writer.change(True, after=30.0)  # a quiet spell: at once again
    assert lines[3].startswith("storage writes far behind: stopped")
    assert not writer.clock.getDelayedCalls()


def test_stopping_drops_a_line_not_yet_due(lines):
    writer = Writer()
    writer.change(True)
    writer.change(False, after=1.0)
    writer.log.stop()
    writer.clock.advance(60.0)
    assert len(lines) == 1 and not writer.clock.getDelayedCalls()
