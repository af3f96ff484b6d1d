# -*- test-case-name: tests.unit.test_backpressure -*-
"""Slow consumers: stop handing a connection messages while it cannot take them.

A protocol that buffers its deliveries and writes them once per reactor turn
mixes this in and registers itself on its transport as a streaming
``IPushProducer``.  Delivery to the connection pauses (``broker.pause``: the
dispatch loop skips its consumers) when either

- the transport's write buffer passes Twisted's high-water mark (its
  ``bufferSize``, 64 KiB), which calls ``pauseProducing``; it resumes when
  the buffer has drained (``resumeProducing``), or
- what this turn has buffered but not yet written passes
  ``OUTPUT_HIGH_WATER``: the dispatch loop hands out up to
  ``--dispatch-batch`` messages per queue per turn, and without this check a
  turn of large messages could buffer batch x size bytes for one slow
  client.  The flush at the end of the turn clears it.

So what the server holds for a client that does not read is bounded by
about ``OUTPUT_HIGH_WATER`` + the transport's buffer + the kernel's socket
buffers; the rest stays in the queue, where other consumers can get it.
"""

from __future__ import annotations

from typing import Any

OUTPUT_HIGH_WATER = 256 * 1024
"""Bytes of deliveries one turn may buffer for a connection before it is paused."""


class Backpressure:
    """``IPushProducer`` half of a delivering protocol (see the module docstring)."""

    broker: Any
    connection: Any
    _closing: bool
    _out_bytes = 0
    _transport_full = False
    _over_mark = False
    _publisher = False

    def _publishing(self) -> None:
        """This connection's first publish: the memory alarm may stop reading from it
        (``IFlowControlled``).  Protocols call it behind ``if not self._publisher``,
        which keeps the per-publish cost to one attribute test."""
        self._publisher = True
        self.broker.flow.publishing(self)

    def pauseProducing(self) -> None:
        self._transport_full = True
        self.broker.pause(self.connection)

    def resumeProducing(self) -> None:
        self._transport_full = False
        if not self._over_mark and not self._closing:
            self.broker.resume(self.connection)

    def stopProducing(self) -> None:
        """The connection is going; ``connectionLost`` cleans up."""

    def _count_output(self, size: int) -> None:
        """A delivery of ``size`` bytes was buffered for this turn's write."""
        self._out_bytes += size
        if self._out_bytes > OUTPUT_HIGH_WATER and not self._over_mark:
            self._over_mark = True
            self.broker.pause(self.connection)

    def _output_flushed(self) -> None:
        """This turn's buffer went to the transport."""
        self._out_bytes = 0
        if self._over_mark:
            self._over_mark = False
            if not self._transport_full and not self._closing:
                self.broker.resume(self.connection)
