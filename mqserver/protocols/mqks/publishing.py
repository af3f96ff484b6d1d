# -*- test-case-name: tests.unit.test_mqks_runs,tests.unit.test_mqks_protocol -*-
"""MQKS publishes: one at a time, or gathered into runs within a received chunk.

A client that pipelines sends many ``publish`` lines per chunk, most of them
to one event.  The broker stores consecutive publishes of one event as a run
(``IBroker.publish_event_run``) for about two thirds of what one publish
costs, and even a single publish now goes through that loop; so the
protocol gathers them (issue 8).  A line joins the chunk's run only where
the one-at-a-time way (``_publish``) would publish it with no error: a
publish with a usual request id and an event whose name already passed its
check, with or without ``--confirm``.  The run is stored before anything
else the chunk does, answers or logs: before another event's publish, any
other line (an ack, a consume, a malformed publish, ...), a too-long line's
error, and the chunk's pump.  Stored there, it answers exactly as its lines
one by one would, in the same place: a refusal (``reject-publish``) is an
error for that line, and the lines after it each get their own attempt.

Confirmed publishes (issue 19) are answered together: the ids of the
chunk's stored ``--confirm`` lines wait for one ``broker.durable()`` and
their ``ok `` lines go out in one write, in request order, taken before
any other output the chunk makes (an error, another line's answer) and at
the chunk's end.  One wait for all of them is the wait each would have had:
every op added in one reactor turn goes to the store in the same batch, and
a run that stored nothing (an event bound to no queue) takes its wait at
once, as a lone confirm would.  Even on the memory store (nothing to wait
for) the replies keep their place among the others.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from twisted.logger import Logger

from mqserver.broker.overflow import QueueFullError
from mqserver.protocols.mqks.codec import CONFIRM, MQKSError

# the namespace operators filter MQKS errors on (they were logged by protocol.py)
log = Logger(namespace="mqserver.protocols.mqks.protocol")
first = itemgetter(0)  # a run entry's request id


class Publishing:
    """The publishing half of ``MQKSProtocol`` (a mixin: it uses the protocol's attributes)."""

    broker: Any
    factory: Any
    _max_id: int
    _checked_events: set[bytes]
    _publisher: bool
    _publishing: Any  # Backpressure's
    _confirm: Any  # Output's
    _error: Any  # Output's
    _store_pending: Any  # Acking's
    _confirm_all: Any  # Output's
    # the publishes of this chunk not stored yet, all to ``_run_event``, and
    # where the confirmed ones among them are in ``_run``
    _run: list[tuple[bytes, bytes]]
    _run_confirms: list[int]
    _run_event = b""
    # the request ids of this chunk's confirmed publishes, stored and not yet answered
    _confirms: list[bytes]

    def _publish(self, request_id: bytes, words: list[bytes]) -> None:
        """``publish [--confirm] {event} {body}``, one at a time (a line ``_gather`` left)."""
        if len(words) < 4:
            raise MQKSError("publish needs an event and data")
        event = words[2]
        body = words[3]
        confirm = event == CONFIRM  # "--confirm " only as the first word
        if confirm:
            event, _, body = body.partition(b" ")
        if not event or not body:
            raise MQKSError("publish needs an event and data")
        if event not in self._checked_events:
            self.factory.check_event(event)
        if not self._publisher:
            self._publishing()
        self.broker.publish_event(event, request_id, body, None, None, "mqks")
        if confirm:
            self._confirm(request_id)

    def _gather(self, words: list[bytes]) -> bool:
        """Add a publish line split into four words to the chunk's run, if it can go there.

        False for a line ``_publish`` could answer with an error: it goes
        the one-at-a-time way, after the run is stored.  Ids other than
        letters and digits also go that way, where they are checked.
        """
        request_id, _, event, body = words
        if not (request_id.isalnum() and len(request_id) <= self._max_id):
            return False
        confirm = event == CONFIRM  # "--confirm " only as the first word
        if confirm:
            event, _, body = body.partition(b" ")
            if not body:
                return False
        if event not in self._checked_events:
            return False
        if not self._run or event != self._run_event:
            self._store_pending()  # acks or another event's publishes: they came first
            self._run_event = event
        if not self._publisher:
            self._publishing()
        if confirm:
            self._run_confirms.append(len(self._run))
        self._run.append((request_id, body))
        return True

    def _store_run(self) -> None:
        """Publish the gathered run: one broker run, another after each refusal."""
        run, self._run = self._run, []
        confirmed, self._run_confirms = self._run_confirms, []
        event = self._run_event
        start = 0  # where in ``run`` this attempt begins
        while start < len(run):
            try:
                routed = self.broker.publish_event_run(
                    event, run[start:] if start else run, None, None, "mqks")
            except QueueFullError as e:
                # the confirms before it, then the refused line's error; the
                # lines after it try again
                refused = start + e.stored
                self._stored(run, confirmed, start, refused)
                self._answer_confirms()
                self._error(run[refused][0], str(e))
                start = refused + 1
            except Exception:
                # not knowing which of them went in, none is answered as stored
                log.failure("mqks {action} failed", action=b"publish")
                self._answer_confirms()
                for request_id, _ in run[start:]:
                    self._error(request_id, "internal error")
                return
            else:
                if confirmed:
                    self._stored(run, confirmed, start, len(run))
                    if not routed:
                        # no op was added: wait now, as a lone confirm would,
                        # not behind what later lines add
                        self._answer_confirms()
                return

    def _stored(self, run: list[tuple[bytes, bytes]], confirmed: list[int],
                start: int, end: int) -> None:
        """The confirmed lines among ``run[start:end]`` are stored: they await their answer."""
        if start or end < len(run):  # around a refusal
            confirmed = [i for i in confirmed if start <= i < end]
        self._confirms += map(first, map(run.__getitem__, confirmed))

    def _answer_confirms(self) -> None:
        """One durability wait and one write for the confirmed publishes stored so far."""
        if self._confirms:
            request_ids, self._confirms = self._confirms, []
            self._confirm_all(request_ids)
