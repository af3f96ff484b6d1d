"""The memory alarm on a fake clock with a fake measurement."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock
from zope.interface import implementer
from zope.interface.verify import verifyObject

from mqserver.broker.core import Broker
from mqserver.broker.flow import (
    MemoryAlarm,
    parse_watermark,
    physical_memory,
    rss_bytes,
    watermark_bytes,
)
from mqserver.interfaces import IFlowControlled
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink


@implementer(IFlowControlled)
class Publisher:
    def __init__(self) -> None:
        self.reading = True
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.reading = False
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.calls.append("resume")


class Gauge:
    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


@pytest.fixture
def alarm() -> tuple[MemoryAlarm, Clock, Gauge]:
    clock = Clock()
    gauge = Gauge()
    alarm = MemoryAlarm(clock, measure=gauge)
    alarm.configure(1000, interval=1.0)
    alarm.start()
    return alarm, clock, gauge


def test_publishers_pause_at_the_high_mark_and_resume_below_the_low(alarm):
    alarm, clock, gauge = alarm
    first, second = Publisher(), Publisher()
    verifyObject(IFlowControlled, first)
    alarm.publishing(first)
    alarm.publishing(second)
    gauge.value = 999
    clock.advance(1)
    assert not alarm.active and first.reading
    gauge.value = 1000
    clock.advance(1)
    assert alarm.active and alarm.alarms == 1
    assert not first.reading and not second.reading
    gauge.value = 950  # between low (900) and high: stays on
    clock.advance(1)
    assert alarm.active
    gauge.value = 899
    clock.advance(1)
    assert not alarm.active
    assert first.calls == ["pause", "resume"] and second.reading


def test_a_new_publisher_during_the_alarm_is_paused_at_once(alarm):
    alarm, clock, gauge = alarm
    gauge.value = 5000
    clock.advance(1)
    late = Publisher()
    alarm.publishing(late)
    alarm.publishing(late)  # its next publish changes nothing
    assert late.calls == ["pause"]


def test_a_forgotten_publisher_is_not_resumed(alarm):
    alarm, clock, gauge = alarm
    gone = Publisher()
    alarm.publishing(gone)
    gauge.value = 5000
    clock.advance(1)
    alarm.forget(gone)
    gauge.value = 0
    clock.advance(1)
    assert gone.calls == ["pause"]


def test_a_failing_measurement_keeps_the_loop_alive(alarm):
    alarm, clock, gauge = alarm

    def broken() -> int:
        raise OSError("no /proc")

    alarm.measure = broken
    clock.advance(1)
    alarm.measure = gauge
    gauge.value = 2000
    clock.advance(1)
    assert alarm.active


def test_off_without_a_high_mark():
    clock = Clock()
    alarm = MemoryAlarm(clock, measure=lambda: 10**12)
    alarm.configure(None)
    alarm.start()
    assert not clock.getDelayedCalls()
    alarm.publishing(Publisher())
    assert not alarm.active


def test_the_broker_forgets_a_publisher_when_its_connection_closes():
    broker = Broker(MemoryStore(), Clock())
    sink = RecordingSink()
    connection = broker.connection_opened("test", "127.0.0.1:1", sink)
    broker.flow.publishing(sink)
    broker.connection_closed(connection)
    assert sink not in broker.flow.publishers


@pytest.mark.parametrize(("text", "value"), [
    ("0.4", 0.4), ("0", 0.0), ("1048576", 1048576.0), ("512MiB", 512 * 1024**2),
    ("2g", 2 * 1024**3), ("64 KiB", 64 * 1024),
])
def test_parse_watermark(text, value):
    assert parse_watermark(text) == value


@pytest.mark.parametrize("text", ["-1", "lots", "-2GiB"])
def test_parse_watermark_refuses(text):
    with pytest.raises(ValueError):
        parse_watermark(text)


def test_watermark_bytes_resolves_fractions_of_ram():
    assert watermark_bytes(0.5, ram=8000) == 4000
    assert watermark_bytes(0) is None
    assert watermark_bytes(0.5, ram=0) is None
    assert watermark_bytes(123456.0) == 123456


def test_a_container_limit_below_the_ram_is_what_counts(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")  # cgroup v2 without a limit
    v1.write_text("1073741824\n")
    assert physical_memory((str(v2), str(v1))) == 1073741824
    v1.write_text(str(2**62))  # v1's "no limit" is a huge number
    assert physical_memory((str(v2), str(v1))) == physical_memory(())


def test_real_measurements_are_plausible():
    assert rss_bytes() > 1024 * 1024
    assert physical_memory() > rss_bytes()


def test_a_store_far_behind_pauses_publishers_as_the_alarm_does(alarm):
    alarm, clock, gauge = alarm
    publisher = Publisher()
    alarm.publishing(publisher)
    alarm.store_behind(True)
    assert not publisher.reading and alarm.paused and not alarm.active
    late = Publisher()
    alarm.publishing(late)
    assert not late.reading, "a new publisher is paused at once"
    gauge.value = 2000
    clock.advance(1.0)  # the alarm too: still one pause
    alarm.store_behind(False)
    assert publisher.calls == ["pause"] and alarm.paused, "the alarm still holds them"
    gauge.value = 0
    clock.advance(1.0)
    assert publisher.calls == ["pause", "resume"] and late.reading and not alarm.paused


def test_a_burst_past_the_writers_mark_pauses_publishers_until_it_is_written():
    from tests.unit.test_broker import RecordingDurableStore

    clock = Clock()
    store = RecordingDurableStore()
    broker = Broker(store, clock)
    broker.writer.behind_at = 10
    publisher = Publisher()
    broker.flow.publishing(publisher)
    broker.publish_to_queue_run(b"q", [(b"m%d" % n, b"x") for n in range(8)])
    assert publisher.reading
    broker.publish_to_queue_run(b"q", [(b"m%d" % n, b"x") for n in range(8, 12)])
    assert not publisher.reading and broker.flow.store_waiting
    clock.advance(0)
    store.pending.pop().callback(None)
    assert publisher.reading and not broker.flow.paused
