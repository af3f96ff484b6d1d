"""The broker's own eMQP scheduler: timers on a fake clock, records as the store keeps them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.model import QueueOptions
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import EMQPError, Schedule
from mqserver.protocols.emqp.scheduler import NAMESPACE, ScheduleRunner, next_cron
from mqserver.storage.memory import MemoryStore

RUN = json.dumps(["run", {"callable": "f", "path": "m", "args": [], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}]).encode()
START = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC).timestamp()


@pytest.fixture
def setup():
    clock = Clock()
    clock.advance(START)
    broker = Broker(MemoryStore(), clock)
    runs: list[tuple[bytes, bytes, bytes]] = []
    runner = ScheduleRunner(broker, lambda *run: runs.append(run))
    return clock, broker, runner, runs


def test_next_cron_is_utc():
    assert next_cron("0 13 * * *", START) == datetime(2026, 1, 1, 13, 0, tzinfo=UTC).timestamp()
    assert next_cron("* * * * *", START) == START + 30


def test_interval_job_runs_at_once_then_on_the_interval_without_catching_up(setup):
    clock, _broker, runner, runs = setup
    runner.schedule(Schedule(b"q", b"", 10, RUN, b""))
    clock.advance(0)
    assert runs == [(b"q", b"", RUN)]
    clock.advance(10)
    assert len(runs) == 2
    clock.advance(35)  # a late timer runs once; the next run is one interval after it
    assert len(runs) == 3
    clock.advance(9)
    assert len(runs) == 3
    clock.advance(1)
    assert len(runs) == 4


def test_run_count_is_persisted_after_each_run(setup):
    clock, broker, runner, runs = setup
    key = runner.schedule(Schedule(b"q", b"run_count:3,nohaste", 5, RUN, b"")).encode()
    clock.advance(5)
    stored = json.loads(broker.records[NAMESPACE][key])
    assert stored[1] == "nohaste,run_count:2"
    clock.advance(5)
    clock.advance(5)
    assert len(runs) == 3 and key not in broker.records[NAMESPACE]
    assert runner.jobs == {}


def test_records_restore_and_bad_records_are_dropped(setup):
    clock, broker, runner, runs = setup
    key = runner.schedule(Schedule(b"q", b"nohaste", -1, RUN, b"*/5 * * * *"))
    broker.put_record(NAMESPACE, b"junk", b"not json")
    broker.put_record(NAMESPACE, b"bad-cron", json.dumps(["q", "", -1, "x", "nope"]).encode())
    runner.stop()
    again = ScheduleRunner(broker, lambda *run: runs.append(run))
    again.load()
    assert list(again.jobs) == [key]
    assert set(broker.records[NAMESPACE]) == {key.encode()}
    clock.advance(5 * 60)
    assert len(runs) == 1


def test_replacing_a_job_keeps_one_timer(setup):
    clock, _broker, runner, runs = setup
    runner.schedule(Schedule(b"q", b"nohaste", 10, RUN, b""))
    runner.schedule(Schedule(b"other", b"nohaste", 10, RUN, b""))
    clock.advance(10)
    assert runs == [(b"other", b"nohaste", RUN)]
    assert runner.unschedule(RUN) and not runner.unschedule(RUN)


@pytest.mark.parametrize(
    "schedule",
    [Schedule(b"q", b"", 0, RUN, b""), Schedule(b"q", b"", -2, RUN, b""),
     Schedule(b"q", b"", -1, RUN, b"61 * * * *"), Schedule(b"q", b"timeout:x", 5, RUN, b""),
     Schedule(b"q", b"", 5, b"{}", b"")],
)
def test_bad_schedules_raise(setup, schedule):
    _, broker, runner, _ = setup
    with pytest.raises(EMQPError):
        runner.schedule(schedule)
    assert runner.jobs == {} and not broker.records.get(NAMESPACE)


def test_a_failing_run_is_logged_and_the_job_goes_on(setup):
    clock, broker, _, _ = setup
    calls = []

    def run(*args):
        calls.append(args)
        raise RuntimeError("queue full")

    runner = ScheduleRunner(broker, run)
    runner.schedule(Schedule(b"q", b"", 1, RUN, b""))
    clock.advance(0)
    clock.advance(1)
    assert len(calls) == 2
    assert codec.schedule_hash(RUN) in runner.jobs


def test_a_run_into_a_full_queue_is_skipped_and_not_counted(setup):
    clock, broker, _runner, _runs = setup
    broker.declare_queue(b"q", QueueOptions(max_length=1, overflow="reject-publish"))
    runner = ScheduleRunner(broker, lambda queue, headers, payload: broker.publish_to_queue(
        queue, b"run", payload))
    key = runner.schedule(Schedule(b"q", b"run_count:3", 5, RUN, b""))
    clock.advance(0)
    clock.advance(5)  # the queue is full: skipped
    assert runner.jobs[key].runs_left == 2
    broker.purge(b"q")
    clock.advance(5)
    assert runner.jobs[key].runs_left == 1
