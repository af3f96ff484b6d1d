"""The journal process: framed marshal batches in, segments out, encoded when the broker pauses."""

from __future__ import annotations

import json
import marshal
import subprocess
import sys
import time
from pathlib import Path

from mqserver.journal.schema import SLIM_PUBLISHED
from mqserver.journal.sink import HEADER, MARSHAL_VERSION, Pile, frame

T0 = 1_795_000_000.25  # 2026-11-18T11:06:40.250000Z
EVENT = ("published", T0, b"q", b"m1", T0, 0, None, None, "mqks", 3, None, None, {"h": "1"},
         b"abc")
SLIM = (SLIM_PUBLISHED, T0, b"q", b"m2", "mqks", 3, None, {"h": "1"}, b"abc")


def records(directory: Path, suffix: str = ".jsonl") -> list[dict]:
    out = []
    for path in sorted(directory.glob(f"date=*/*{suffix}")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def sink(directory: Path) -> list[str]:
    return [sys.executable, "-m", "mqserver.journal.sink", str(directory), "--node", "p",
            "--bodies"]


def test_sink_process_reads_framed_batches_and_seals_at_end_of_input(tmp_path):
    # batches are flat lists of values, as Journal.append (list.extend) builds them
    data = b"".join(frame(list(EVENT)) + frame(list(SLIM)))
    subprocess.run(sink(tmp_path / "j"), input=data, check=True, timeout=60)
    got = records(tmp_path / "j")
    assert [(r["seq"], r["message_id"], r["body"]) for r in got] == [(1, "m1", "YWJj"),
                                                                    (2, "m2", "YWJj")]
    assert not list((tmp_path / "j").glob("date=*/*.open"))


def test_sink_process_writes_what_it_holds_once_the_broker_pauses(tmp_path):
    process = subprocess.Popen(sink(tmp_path / "j"), stdin=subprocess.PIPE)
    try:
        process.stdin.write(b"".join(frame(list(EVENT))))
        process.stdin.flush()
        deadline = time.monotonic() + 30
        while not records(tmp_path / "j", ".open") and time.monotonic() < deadline:
            time.sleep(0.05)  # the sink's QUIET timer runs in its own process
        assert [r["message_id"] for r in records(tmp_path / "j", ".open")] == ["m1"]
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert [r["message_id"] for r in records(tmp_path / "j")] == ["m1"]


def test_a_pile_is_written_when_it_is_too_old_or_too_big():
    now = [100.0]
    pile = Pile(lambda: now[0], max_age=5.0, max_bytes=10)
    assert not pile
    assert pile.add(b"abc") is False
    now[0] += 4.9
    assert pile.add(b"def") is False and pile
    now[0] += 0.1  # five seconds after the first batch
    assert pile.add(b"g") is True
    assert pile.take() == [b"abc", b"def", b"g"] and not pile and pile.size == 0
    assert pile.add(b"0123456789") is True  # the age restarts with the next batch; size alone
    pile.take()
    now[0] += 60
    assert pile.add(b"x") is False


def test_batches_cross_as_marshal_version_2_and_come_back_equal():
    values = [SLIM_PUBLISHED, T0, b"q", b"m1", b"mqks", 3, None, {"h": "1"}, b"abc", "acked"]
    header, payload = frame(values)
    data = header + payload
    (size,) = HEADER.unpack(data[:HEADER.size])
    assert MARSHAL_VERSION == 2 and marshal.loads(data[HEADER.size:]) == values
    assert size == len(data) - HEADER.size


def test_the_reader_stops_reading_while_the_encoder_is_behind():
    import io
    import queue
    import threading

    from mqserver.journal.sink import _reader

    stream = io.BytesIO(b"".join(part for n in range(5) for part in frame([n])))
    batches: queue.Queue[bytes | None] = queue.Queue(2)
    reader = threading.Thread(target=_reader, args=(stream, batches), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not batches.full() and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader thread fills the queue
    reader.join(0.2)
    assert reader.is_alive() and batches.full()  # waiting with the third batch read
    frame_size = len(b"".join(frame([0])))
    assert stream.tell() == 3 * frame_size  # the last two are still unread
    got = [batches.get() for _ in range(6)]
    reader.join(30)
    assert [marshal.loads(p) for p in got[:5]] == [[n] for n in range(5)] and got[5] is None
