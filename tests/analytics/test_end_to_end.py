"""The real server with --journal, traffic over MQKS and PHPMQ, then the CLI."""

from __future__ import annotations

import socket
import time

from mqserver.analytics import cli
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import FrameDecoder


def recv_until(sock: socket.socket, done, timeout: float = 10.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_journal_of_real_traffic_over_two_protocols(spark, tmp_path, journaled_server):
    journal = tmp_path / "journal"
    ports = journaled_server(journal, "mqks", "phpmq")
    try:
        consumer = socket.create_connection(("127.0.0.1", ports["mqks"]))
        consumer.sendall(b"c consume --confirm q1 e --manual-ack\n")
        recv_until(consumer, lambda d: d.endswith(b"c ok \n"))
        publisher = socket.create_connection(("127.0.0.1", ports["mqks"]))
        publisher.sendall(b"".join(b"m%d publish e body %d\n" % (n, n) for n in range(5)))
        recv_until(consumer, lambda d: d.count(b"\n") >= 5)
        consumer.sendall(b"".join(b"x%d ack --confirm c m%d\n" % (n, n) for n in range(3)))
        recv_until(consumer, lambda d: d.count(b"\n") >= 3)
        consumer.close()  # m3 and m4 go back to the queue...
        second = socket.create_connection(("127.0.0.1", ports["mqks"]))
        second.sendall(b"d consume --confirm q1 e --manual-ack\n")
        got = recv_until(second, lambda d: d.count(b"\n") >= 3)
        assert b"d ok m3 event=e,retry=1 body 3\n" in got  # ...and are redelivered
        second.sendall(b"y3 ack --confirm d m3\ny4 ack --confirm d m4\n")
        recv_until(second, lambda d: d.count(b"\n") >= 2)

        php = socket.create_connection(("127.0.0.1", ports["phpmq"]))
        php.sendall(b"".join(codec.publish(b"pq", b"php %d" % n) for n in range(4)))
        php.sendall(codec.consume(b"pq", 10))
        decoder = FrameDecoder()
        frames = []
        while len(frames) < 4:
            php.settimeout(10)
            decoder.feed(php.recv(65536))
            while (frame := decoder.next_frame()) is not None:
                frames.append(frame)
        php.sendall(b"".join(codec.ack(b"pq", f.packages[codec.MESSAGE_ID]) for f in frames))
        # one connection is handled in order: once this comes back, the acks are in
        php.sendall(codec.consume(b"pq", 0) + codec.publish(b"sync", b"s")
                    + codec.consume(b"sync", 1))
        while decoder.next_frame() is None:
            decoder.feed(php.recv(65536))
        php.close()
        publisher.close()
    finally:
        journaled_server.stop()
    assert not list(journal.glob("date=*/*.open")), "the journal sealed its segment at stop"

    out = tmp_path / "out"
    assert cli.main(["--journal", str(journal), "--out", str(out), "--reports",
                     "throughput,requeues,unterminated,consumers,seq_gaps"]) == 0
    counts: dict[tuple, int] = {}
    for row in spark.read.parquet(str(out / "throughput")).collect():
        key = (row["queue"], row["protocol"], row["event"])
        counts[key] = counts.get(key, 0) + row["count"]
    assert counts[("q1", "mqks", "published")] == 5
    assert counts[("q1", "mqks", "acked")] == 5
    assert counts[("pq", "phpmq", "published")] == 4
    assert counts[("pq", "phpmq", "acked")] == 4
    assert counts[("q1", "mqks", "delivered")] == 7
    # the "sync" queue's last message may or may not be requeued at shutdown
    requeues = spark.read.parquet(str(out / "requeues")).where("queue != 'sync'").collect()
    assert [(r["queue"], r["reason"], r["count"]) for r in requeues] == [
        ("q1", "consumer_gone", 2)]
    open_ = spark.read.parquet(str(out / "unterminated")).collect()
    assert [(r["queue"], r["unterminated"]) for r in open_] == [("sync", 1)]
    by_consumer = {r["consumer"].split("/")[1]: r
                   for r in spark.read.parquet(str(out / "consumers")).collect()}
    assert (by_consumer["c"]["delivered"], by_consumer["c"]["acked"]) == (5, 3)
    assert by_consumer["d"]["ack_rate"] == 1.0 and by_consumer["d"]["protocol"] == "mqks"
    [gaps] = spark.read.parquet(str(out / "seq_gaps")).collect()
    assert (gaps["node"], gaps["min_seq"], gaps["missing"]) == ("e2e", 1, 0)
