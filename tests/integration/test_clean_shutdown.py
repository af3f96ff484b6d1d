"""The clean-shutdown snapshot end to end: a SIGTERM leaves one, the next start reads
it instead of replaying, and a kill -9 after that start replays what was stored since."""

from __future__ import annotations

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
