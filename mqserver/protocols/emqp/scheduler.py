# -*- test-case-name: tests.unit.test_emqp_scheduler -*-
"""SCHEDULE / UNSCHEDULE run by the broker itself, persisted as broker records.

The original needs a separate ``emq-scheduler`` process and Redis; here a
job is a record (``broker.put_record``) keyed by eventmq's job hash, so it
survives a restart with any durable store, and each run is a REQUEST put
straight into the core.  Timers are ``callLater``s on the broker's clock.

- Interval jobs run every ``interval`` seconds, at once unless ``nohaste``.
  Missed runs are not caught up: a late timer runs once and the next run is
  one interval later.  After a restart a job first runs one interval later.
- Cron jobs (``interval`` -1) use ``croniter`` in UTC, as eventmq's scheduler
  does; like interval jobs they also run at once unless ``nohaste``.
- ``run_count:N`` limits the number of runs (the immediate one included);
  the remaining count is persisted after each run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from twisted.logger import Logger

from mqserver.broker.overflow import QueueFullError
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import EMQPError, Schedule

log = Logger()

NAMESPACE = b"emqp-schedules"
RUN_COUNT = "run_count"


def next_cron(expression: str, now: float) -> float:
    """The first time after ``now`` that the cron ``expression`` matches (UTC)."""
    from croniter import croniter

    start = datetime.fromtimestamp(now, UTC)
    return float(croniter(expression, start).get_next(float))


def check_cron(expression: str) -> None:
    from croniter import croniter

    if not croniter.is_valid(expression):
        raise EMQPError(f"invalid cron expression {expression!r}")


class Job:
    """One schedule: its definition, as stored, and its timer."""

    def __init__(self, key: str, schedule: Schedule) -> None:
        self.key = key
        self.schedule = schedule
        self.call: Any = None
        self.next_run = 0.0
        self.runs_left = codec.parse_headers(schedule.headers).number(RUN_COUNT)

    def record(self) -> bytes:
        s = self.schedule
        headers = codec.parse_headers(s.headers)
        if self.runs_left is not None:
            headers.values[RUN_COUNT] = self.runs_left
        return json.dumps([
            codec.text(s.queue), codec.text(codec.format_headers(headers)), s.interval,
            codec.text(s.payload), codec.text(s.cron),
        ]).encode("ascii")

    @classmethod
    def from_record(cls, key: bytes, value: bytes) -> Job:
        queue, headers, interval, payload, cron = json.loads(value)
        schedule = Schedule(
            codec.raw(queue), codec.raw(headers), int(interval), codec.raw(payload),
            codec.raw(cron),
        )
        return cls(key.decode("ascii"), schedule)


class ScheduleRunner:
    """Keeps the broker's scheduled jobs and fires them as requests."""

    def __init__(self, broker: Any, run: Callable[[bytes, bytes, bytes], None]) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.run = run
        self.jobs: dict[str, Job] = {}

    def load(self) -> None:
        """Re-arm the jobs the store recovered (called once listening starts)."""
        for key, value in sorted(self.broker.records.get(NAMESPACE, {}).items()):
            try:
                job = Job.from_record(key, value)
                self._validate(job.schedule)
            except (ValueError, TypeError, EMQPError) as e:
                log.warn("emqp: dropping unreadable schedule {key!r}: {e}", key=key, e=e)
                self.broker.delete_record(NAMESPACE, key)
                continue
            self.jobs[job.key] = job
            self._arm(job, first=True, immediate=False)
        if self.jobs:
            log.info("emqp: {n} scheduled jobs restored", n=len(self.jobs))

    def stop(self) -> None:
        for job in self.jobs.values():
            if job.call is not None and job.call.active():
                job.call.cancel()
            job.call = None

    @staticmethod
    def _validate(schedule: Schedule) -> None:
        if schedule.interval == -1:
            check_cron(schedule.cron.decode("ascii", "replace"))
        elif schedule.interval <= 0:
            raise EMQPError(f"interval must be positive or -1 (cron), not {schedule.interval}")

    def schedule(self, schedule: Schedule) -> str:
        """Add or replace a job; raises ``EMQPError`` for a malformed one."""
        key = codec.schedule_hash(schedule.payload)
        codec.parse_headers(schedule.headers)
        self._validate(schedule)
        old = self.jobs.pop(key, None)
        if old is not None and old.call is not None and old.call.active():
            old.call.cancel()
        job = Job(key, schedule)
        if job.runs_left == 0:
            self.broker.delete_record(NAMESPACE, key.encode("ascii"))
            return key
        self.jobs[key] = job
        self.broker.put_record(NAMESPACE, key.encode("ascii"), job.record())
        nohaste = codec.parse_headers(schedule.headers).nohaste
        self._arm(job, first=True, immediate=not nohaste)
        return key

    def unschedule(self, payload: bytes) -> bool:
        key = codec.schedule_hash(payload)
        job = self.jobs.pop(key, None)
        self.broker.delete_record(NAMESPACE, key.encode("ascii"))
        if job is None:
            return False
        if job.call is not None and job.call.active():
            job.call.cancel()
        return True

    def _arm(self, job: Job, first: bool, immediate: bool) -> None:
        now = self.clock.seconds()
        s = job.schedule
        if immediate:
            job.next_run = now
        elif s.interval == -1:
            job.next_run = next_cron(s.cron.decode("ascii"), now)
        elif first or job.next_run + s.interval <= now:
            job.next_run = now + s.interval
        else:
            job.next_run += s.interval
        job.call = self.clock.callLater(max(0.0, job.next_run - now), self._fire, job)

    def _fire(self, job: Job) -> None:
        job.call = None
        try:
            if self.jobs.get(job.key) is not job:
                return
            s = job.schedule
            self.run(s.queue, s.headers, s.payload)
            if job.runs_left is not None:
                job.runs_left -= 1
                if job.runs_left <= 0:
                    del self.jobs[job.key]
                    self.broker.delete_record(NAMESPACE, job.key.encode("ascii"))
                    return
                self.broker.put_record(NAMESPACE, job.key.encode("ascii"), job.record())
        except QueueFullError as e:
            # this run is skipped (not counted); the next one is armed as usual
            log.warn("emqp: scheduled job {key} skipped a run: {e}", key=job.key, e=e)
        except Exception:
            log.failure("emqp: scheduled job {key} failed to run", key=job.key)
        if self.jobs.get(job.key) is job:
            try:
                self._arm(job, first=False, immediate=False)
            except Exception:
                log.failure("emqp: could not re-arm scheduled job {key}", key=job.key)
