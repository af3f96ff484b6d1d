"""The journal process: ``python -m mqserver.journal.sink DIR [options]``.

The broker sends batches of events, flattened into one list of values, on
stdin, each framed as a 4-byte big-endian length and a ``marshal`` payload.
Encoding JSON costs a few microseconds per record; doing it here, on
another core, keeps that cost off the broker.  End of input seals the
open segment and exits; idle segments are sealed on time while waiting.
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
from typing import BinaryIO

from mqserver.journal.segments import SegmentWriter

HEADER = struct.Struct(">I")


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


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _reader(stream: BinaryIO, batches: queue.Queue[bytes | None]) -> None:
    """Drain stdin into memory as fast as it comes, so the broker never buffers."""
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
    # (input waits in this process's memory, never in the broker's)
    os.nice(19)
    writer = SegmentWriter(args.directory, args.node, time.time, args.bodies,
                           args.segment_bytes, args.segment_seconds)
    for path in writer.recovered:
        print(f"journal: sealed {path} left open by an earlier run", file=sys.stderr)
    batches: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_reader, args=(sys.stdin.buffer, batches), daemon=True).start()
    try:
        while True:
            try:
                payload = batches.get(timeout=1.0)
            except queue.Empty:
                writer.seal_if_due()
                continue
            if payload is None:
                break
            writer.write(marshal.loads(payload))
    finally:
        writer.seal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
