"""The thread that writes journal batches to the journal process's pipe."""

from __future__ import annotations

import marshal
import os
import threading

from mqserver.journal.feeder import Feeder
from mqserver.journal.sink import HEADER


def read_frames(fd: int) -> list[list]:
    with os.fdopen(fd, "rb") as stream:
        data = stream.read()
    frames = []
    while data:
        (size,) = HEADER.unpack(data[:HEADER.size])
        frames.append(marshal.loads(data[HEADER.size:HEADER.size + size]))
        data = data[HEADER.size + size:]
    return frames


def test_batches_arrive_in_order_and_close_ends_the_stream():
    read_end, write_end = os.pipe()
    errors: list = []
    feeder = Feeder(write_end, lambda e, lost: errors.append((e, lost)))
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(read_frames(read_end)))
    reader.start()
    # bigger than any pipe buffer, so the writes block and resume
    big = [b"x" * 1000] * 5000
    feeder.send(["published", 1.5, b"q"])
    feeder.send(big)
    feeder.send([])
    feeder.close()
    feeder.join(30)
    reader.join(30)
    assert got == [["published", 1.5, b"q"], big, []]
    assert errors == [] and not feeder.failed


def test_a_reader_that_went_away_is_reported_once_and_later_batches_are_dropped():
    read_end, write_end = os.pipe()
    os.close(read_end)
    errors: list = []
    feeder = Feeder(write_end, lambda e, lost: errors.append((type(e), lost)))
    feeder.send([1, 2, 3])
    feeder.send([4, 5])
    feeder.close()
    feeder.join(30)
    assert errors == [(BrokenPipeError, 3)] and feeder.failed
