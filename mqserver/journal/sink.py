# -*- test-case-name: tests.unit.test_journal_sink -*-
"""The journal process: ``python -m mqserver.journal.sink DIR [options]``.

The broker sends batches of events, flattened into one list of values, on
stdin, each framed as a 4-byte big-endian length and a ``marshal`` payload.
Encoding JSON costs a few microseconds per record; doing it here, on
another core, keeps that cost off the broker.  End of input seals the
open segment and exits; idle segments are sealed on time while waiting.

Even on another core, encoding during a burst takes CPU time the broker and
its clients could use (on a 2-core machine they use most of it), so what
arrives is held (``Pile``) until the broker pauses: nothing new for
``QUIET`` seconds.  Under a steady load that never pauses, a pile is
written once it is ``MAX_AGE`` seconds old or ``MAX_BYTES`` big.  Readers
only read sealed segments, so they never see the difference.
"""

from __future__ import annotations

import argparse
import marshal
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from mqserver.journal.segments import SegmentWriter

HEADER = struct.Struct(">I")

QUIET = 0.5
"""Seconds without a batch (the broker hands one over every 0.2 s while it
journals anything) after which what is held is encoded."""
MAX_AGE = 5.0
"""Seconds the oldest held batch may wait under a load that never pauses."""
MAX_BYTES = 256 * 1024 * 1024
"""Held marshal bytes (about two million W1 messages) that are encoded at once."""
MAX_WAITING = 256
"""Batches read but not yet taken by the encoder (about 50 s of the broker's
flushes).  Past it this process stops reading: the batches wait in the
broker, whose memory alarm (``--memory-high-watermark``) sees them and stops
publishers if they pile up, where here nothing would."""


MARSHAL_VERSION = 2
"""Version 2 has no back-references: later versions look every value with
more than one reference up in a table, which made up a third of what
marshalling cost the broker.  The output is larger, which costs nothing that
matters here (the hot records carry no ``str``, which version 2 re-encodes)."""


def frame(values: list) -> list[bytes]:
    """One batch as sent to the journal process: its header and its payload,
    apart so that the payload (megabytes at a high rate) is never copied."""
    payload = marshal.dumps(values, MARSHAL_VERSION)
    return [HEADER.pack(len(payload)), payload]


class Pile:
    """Batches waiting for the broker to pause (see the module doc)."""

    def __init__(self, now: Callable[[], float], max_age: float = MAX_AGE,
                 max_bytes: int = MAX_BYTES) -> None:
        self.now = now
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.payloads: list[bytes] = []
        self.size = 0
        self.since = 0.0

    def __bool__(self) -> bool:
        return bool(self.payloads)

    def add(self, payload: bytes) -> bool:
        """Hold ``payload``; True when the pile must be written now (too old or too big)."""
        if not self.payloads:
            self.since = self.now()
        self.payloads.append(payload)
        self.size += len(payload)
        return self.size >= self.max_bytes or self.now() - self.since >= self.max_age

    def take(self) -> list[bytes]:
        """What is held, oldest first; the pile is empty afterwards."""
        payloads, self.payloads, self.size = self.payloads, [], 0
        return payloads


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _reader(stream: BinaryIO, batches: queue.Queue[bytes | None]) -> None:
    """Drain stdin into ``batches`` as fast as it comes, so the broker does not
    buffer, until ``batches`` is full (see ``MAX_WAITING``)."""
    try:
        while True:
            header = _read_exactly(stream, HEADER.size)
            if header is None:
                break
            payload = _read_exactly(stream, HEADER.unpack(header)[0])
            if payload is None:
                print("journal: input ended inside a batch", file=sys.stderr)
                break
            batches.put(payload)
    finally:
        batches.put(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mqserver journal writer process")
    parser.add_argument("directory")
    parser.add_argument("--node", required=True)
    parser.add_argument("--bodies", action="store_true")
    parser.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--segment-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    # Encoding is the costly part of journaling; at the lowest priority it
    # takes only CPU the broker leaves idle and catches up after a burst
    # (input waits in this process's memory, up to MAX_WAITING batches)
    os.nice(19)
    writer = SegmentWriter(args.directory, args.node, time.time, args.bodies,
                           args.segment_bytes, args.segment_seconds)
    for path in writer.recovered:
        print(f"journal: sealed {path} left open by an earlier run", file=sys.stderr)
    batches: queue.Queue[bytes | None] = queue.Queue(MAX_WAITING)
    threading.Thread(target=_reader, args=(sys.stdin.buffer, batches), daemon=True).start()
    pile = Pile(time.monotonic)

    def write_pile() -> None:
        for held in pile.take():
            writer.write(marshal.loads(held))

    try:
        while True:
            try:
                payload = batches.get(timeout=QUIET if pile else 1.0)
            except queue.Empty:
                write_pile()  # the broker paused
                writer.seal_if_due()
                continue
            if payload is None:
                break
            if pile.add(payload):
                write_pile()
    finally:
        write_pile()
        writer.seal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
