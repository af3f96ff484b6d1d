"""The log's checkpoint end to end: the real server writes one while it runs, and a
kill -9 restart loads it and walks only the records after it (``log_checkpoint``)."""

from __future__ import annotations

import re

COUNT = 3000
MORE = 1000
ACKED = 700


def test_a_crash_restart_starts_from_the_checkpoint(start_server, line_client, tmp_path):
    args = ("--protocol=mqks:tcp:0:interface=127.0.0.1", "--storage=log", "--fsync=interval:50",
            "--log-checkpoint=64:1", f"--data-dir={tmp_path / 'data'}")
    server = start_server(*args)
    producer = line_client(server.ports["mqks"])
    producer.send("r rebind --confirm q e")
    assert producer.read(1) == [b"r ok "]
    producer.send(*[f"m{n} publish e body {n}" for n in range(COUNT)],
                  "s publish --confirm nobody x")
    assert producer.read(1) == [b"s ok "]
    server.wait_for_log("log checkpoint written")

    # after the checkpoint: more messages, and acks of some from before it and after
    producer.send(*[f"m{n} publish e body {n}" for n in range(COUNT, COUNT + MORE)],
                  "t publish --confirm nobody x")
    assert producer.read(1) == [b"t ok "]
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e --manual-ack")
    assert consumer.read(1) == [b"c ok "]
    assert consumer.read(COUNT + MORE, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(COUNT + MORE)]
    acked = [*range(ACKED // 2), *range(COUNT, COUNT + ACKED // 2)]
    consumer.send(*[f"a{n} ack c m{n}" for n in acked[:-1]], f"z ack --confirm c m{acked[-1]}")
    assert consumer.read(1) == [b"z ok "]
    server.process.kill()
    server.process.wait()

    server = start_server(*args)
    started = server.wait_for_log("storage open")
    used = re.search(r"log checkpoint \S+ used: from segment (\d+) offset (\d+), (\d+) records",
                     started)
    assert used, started
    assert re.search(r"messages recovered in [\d.]+ s \(replay\)", started), started
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e")
    assert consumer.read(1) == [b"c ok "]
    left = [n for n in range(COUNT + MORE) if n not in set(acked)]
    assert consumer.read(len(left), timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in left]
    assert consumer.quiet(), "an acked message came back"
