"""The clean-shutdown snapshot end to end: a SIGTERM leaves one, the next start reads
it instead of replaying, and a kill -9 after that start replays what was stored since."""

from __future__ import annotations

import re

import pytest

COUNT = 3000  # past --pack-ready-after: the snapshot holds chunks
HALF = COUNT // 2


@pytest.mark.parametrize("storage", ["sqlite", "log"])
def test_a_restart_from_the_snapshot_then_a_crash(packed_backlog, start_server, line_client,
                                                  tmp_path, storage):
    server, args = packed_backlog(storage, tmp_path / "data", COUNT)
    server.stop()
    assert "clean-shutdown snapshot" in server.text() and "written" in server.text()

    server = start_server(*args)
    started = server.wait_for_log("storage open")
    assert "no replay" in started, started
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e --manual-ack")
    assert consumer.read(1) == [b"c ok "]
    assert consumer.read(COUNT, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(COUNT)]
    consumer.send(*[f"a{n} ack c m{n}" for n in range(HALF)])
    # a confirmed publish after the acks: they are stored once it is answered
    producer = line_client(server.ports["mqks"])
    producer.send("s publish --confirm nobody x")
    assert producer.read(1) == [b"s ok "]
    server.process.kill()
    server.process.wait()

    server = start_server(*args)
    started = server.wait_for_log("storage open")
    assert "no replay" not in started, "the snapshot was used twice"
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e")
    assert consumer.read(1) == [b"c ok "]
    assert consumer.read(COUNT - HALF, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(HALF, COUNT)]
    assert consumer.quiet(), "an acked message came back"


@pytest.mark.parametrize("storage", ["sqlite", "log"])
def test_a_damaged_chunk_is_withheld_then_replayed(packed_backlog, start_server, line_client,
                                                   tmp_path, storage):
    """A byte flipped in one chunk of the snapshot: the start uses it all the same
    (chunks are read after it serves), the damage is found and logged without a
    consumer, and no damaged message is delivered.  The stop writes no snapshot,
    and the next start replays the store: exactly the withheld messages come back."""
    server, args = packed_backlog(storage, tmp_path / "data", COUNT)
    server.stop()
    path = next((tmp_path / "data").rglob("mqserver.snapshot"))
    data = bytearray(path.read_bytes())
    data[data.index(b"body 1500")] ^= 0x01
    path.write_bytes(bytes(data))

    server = start_server(*args)
    assert "no replay" in server.wait_for_log("storage open")
    logged = server.wait_for_log("cannot be read (it fails its checksum); withheld")
    count = int(re.search(r"snapshot: (\d+) messages of queue b'q' \(seqs", logged)[1])
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e")
    assert consumer.read(1) == [b"c ok "]
    lines = consumer.read(COUNT - count, timeout=60)
    assert consumer.quiet()
    delivered = [int(line.split()[2][1:]) for line in lines]
    assert lines == [f"c ok m{n} event=e body {n}".encode() for n in delivered]
    withheld = sorted(set(range(COUNT)) - set(delivered))
    assert delivered == sorted(delivered) and 1500 in withheld
    assert withheld == list(range(withheld[0], withheld[-1] + 1))  # one chunk
    server.stop()
    assert "no clean-shutdown snapshot" in server.text()

    server = start_server(*args)
    assert "no replay" not in server.wait_for_log("storage open")
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e")
    assert consumer.read(1) == [b"c ok "]
    assert consumer.read(len(withheld), timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in withheld]
    assert consumer.quiet(), "an acked message came back"
