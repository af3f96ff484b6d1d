"""A SQLite replay after kill -9 end to end: the big backlogs are counted at the start
and their rows read once the server serves (``sqlite_chunks``); a consumer that
comes at once, and a queue deleted before its rows were read, get exactly what
they should, and a second crash brings back exactly the unacked."""

from __future__ import annotations

import re

COUNT = 5000  # four whole chunks of 1,024 and a tail, in each queue
ACKED = 2600  # across a chunk's edge


def test_a_consumer_at_once_after_a_crash_gets_every_message_in_order(
        packed_backlog, start_server, line_client, tmp_path):
    server, args = packed_backlog("sqlite", tmp_path / "data", 0)
    producer = line_client(server.ports["mqks"])
    producer.send("p rebind --confirm p e")
    assert producer.read(1) == [b"p ok "]
    producer.send(*[f"m{n} publish e body {n}" for n in range(COUNT)],
                  "s publish --confirm nobody x")
    assert producer.read(1) == [b"s ok "]
    server.process.kill()
    server.process.wait()

    server = start_server(*args)
    started = server.wait_for_log("messages recovered in")
    # the line the bench reads (``bench.workloads.REPORTED``)
    assert re.search(rf"2 queues, {2 * COUNT} messages recovered in [\d.]+ s \(replay\)",
                     started), started
    client = line_client(server.ports["mqks"])
    # a queue deleted before its chunks were read; one consumed at once
    client.send("d delete_queue --confirm p", "c consume --confirm q e --manual-ack")
    assert client.read(2) == [b"d ok ", b"c ok "]
    assert client.read(COUNT, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(COUNT)]
    client.send(*[f"a{n} ack c m{n}" for n in range(ACKED)], "s publish --confirm nobody x")
    assert client.read(1) == [b"s ok "]
    server.process.kill()
    server.process.wait()

    server = start_server(*args)
    started = server.wait_for_log("messages recovered in")
    assert f"1 queues, {COUNT - ACKED} messages recovered in " in started, started
    client = line_client(server.ports["mqks"])
    client.send("k consume --confirm p")
    assert client.read(1) == [b"k ok "]
    client.send("c consume --confirm q e")
    assert client.read(1) == [b"c ok "]
    assert client.read(COUNT - ACKED, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(ACKED, COUNT)]
    assert client.quiet(), "an acked or deleted message came back"
    server.stop()
    assert "withheld" not in server.text() and "Traceback" not in server.text()
