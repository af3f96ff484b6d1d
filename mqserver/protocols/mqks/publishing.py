# -*- test-case-name: tests.unit.test_mqks_runs,tests.unit.test_mqks_protocol -*-
"""MQKS publishes: one at a time, or gathered into runs within a received chunk.

A client that pipelines sends many ``publish`` lines per chunk, most of them
to one event.  The broker stores consecutive publishes of one event as a run
(``IBroker.publish_event_run``) for about two thirds of what one publish
costs, and even a single publish now goes through that loop; so the
protocol gathers them (issue 8).  A line joins the chunk's run only where
the one-at-a-time way (``_publish``) would publish it with no reply and no
error: a plain publish (no ``--confirm``) with a usual request id and an
event whose name already passed its check.  The run is stored before
anything else the chunk does, answers or logs: before another event's
publish, any other line (an ack, a consume, a confirmed or malformed
publish, ...), a too-long line's error, and the chunk's pump.  Stored
there, it answers exactly as its lines one by one would, in the same
place: a refusal (``reject-publish``) is an error for that line, and the
lines after it each get their own attempt.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from mqserver.broker.overflow import QueueFullError
from mqserver.protocols.mqks.codec import CONFIRM, MQKSError

# the namespace operators filter MQKS errors on (they were logged by protocol.py)
log = Logger(namespace="mqserver.protocols.mqks.protocol")


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
    _store_runs: Any  # Acking's
    # the plain publishes of this chunk not stored yet, all to ``_run_event``
    _run: list[tuple[bytes, bytes]]
    _run_event = b""

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

        False for a line ``_publish`` could answer (a confirm or an error):
        it goes the one-at-a-time way, after the run is stored.  Ids other
        than letters and digits also go that way, where they are checked.
        """
        request_id, _, event, body = words
        if not (request_id.isalnum() and len(request_id) <= self._max_id) \
                or event not in self._checked_events or event == CONFIRM:
            return False
        if not self._run or event != self._run_event:
            self._store_runs()  # acks or another event's publishes: they came first
            self._run_event = event
        if not self._publisher:
            self._publishing()
        self._run.append((request_id, body))
        return True

    def _store_run(self) -> None:
        """Publish the gathered run: one broker run, another after each refusal."""
        entries, self._run = self._run, []
        event = self._run_event
        while entries:
            try:
                self.broker.publish_event_run(event, entries, None, None, "mqks")
                return
            except QueueFullError as e:
                # the refused line's error, then the lines after it try again
                self._error(entries[e.stored][0], str(e))
                entries = entries[e.stored + 1:]
            except Exception:
                # not knowing which of them went in, none is answered as stored
                log.failure("mqks {action} failed", action=b"publish")
                for request_id, _ in entries:
                    self._error(request_id, "internal error")
                return
