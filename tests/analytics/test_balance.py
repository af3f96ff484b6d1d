"""The real server's journal of a mixed workload balances for every queue.

``twistd -n mqserver --journal`` takes traffic from real clients (raw MQKS
and PHPMQ sockets, the treq HTTP client): acks, auto-acks, rejects, retries
running out into a dead-letter queue, PHPMQ requeue and dead letter, TTL
expiry, drop-head, purge, consumers disconnecting, a queue deleted when
unused, queues deleted with consumers attached (over MQKS and HTTP), and an
operator's move out of a dead-letter queue.
Then ``mqserver-analytics`` runs the balance report on a real SparkSession,
and every queue's terms are the exact numbers this workload makes.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from typing import Any

import pytest_twisted
from treq.client import HTTPClient as TreqClient
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool

from mqserver.analytics import cli
from mqserver.client import APIError, HTTPClient
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import CONTENT, MESSAGE_ID, FrameDecoder

TOKEN = "balance-token"

EXPECTED = {  # published, acked, dead_lettered, expired, moved, purged, deleted, still_there
    "orders": (10, 8, 0, 0, 0, 0, 0, 2),  # acks, a reject, a disconnect, two left at shutdown
    "auto": (3, 3, 0, 0, 0, 0, 0, 0),  # auto-acked
    "tmp": (5, 1, 0, 0, 0, 0, 4, 0),  # MQKS delete_queue while its consumer held four
    "scratch": (3, 1, 0, 0, 0, 0, 2, 0),  # deleted when unused, after its consumer left
    "jobs": (4, 1, 2, 0, 0, 0, 0, 1),  # HTTP: retries ran out for two, one rejected back
    "jobs.dead": (2, 0, 0, 0, 1, 1, 0, 0),  # their dead-letter copies: one moved, one purged
    "replay": (1, 0, 0, 0, 0, 0, 0, 1),  # the one moved
    "pq": (6, 2, 1, 2, 0, 0, 0, 1),  # PHPMQ: TTL, 006, 005 then a disconnect
    "pdel": (5, 0, 0, 0, 0, 0, 5, 0),  # HTTP delete with a PHPMQ consumer holding two
    "capped": (5, 0, 3, 0, 0, 0, 0, 2),  # max_length 2, drop-head
}
TERMS = ("published", "acked", "dead_lettered", "expired", "moved", "purged", "deleted",
         "still_there")


class Lines:
    """A raw-socket MQKS client: send lines, read lines with a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, *lines: str) -> None:
        self.sock.sendall("".join(line + "\n" for line in lines).encode())

    def read(self, count: int) -> list[str]:
        deadline = time.monotonic() + 10
        while self.buffer.count(b"\n") < count:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, self.buffer
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n", count)
        return [line.decode() for line in lines]


class PHPMQ:
    """A raw-socket PHPMQ client: send frames, read dispatched messages."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()

    def read(self, count: int) -> dict[bytes, bytes]:
        """``count`` dispatches: message id by body."""
        got: dict[bytes, bytes] = {}
        deadline = time.monotonic() + 10
        while len(got) < count:
            while (frame := self.decoder.next_frame()) is not None:
                got[frame.packages[CONTENT]] = frame.packages[MESSAGE_ID]
            if len(got) < count:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = self.sock.recv(65536)
                assert chunk, got
                self.decoder.feed(chunk)
        return got


@inlineCallbacks
def until(http: HTTPClient, queue: str, **want: int) -> Any:
    """Poll the queue's view (HTTP) until its counters, depth and in_flight are
    as wanted, or ``gone=1`` until it is deleted; a 10 s deadline."""
    deadline = time.monotonic() + 10
    while True:
        try:
            view = yield http.queue(queue)
            have = {**view["counters"], "depth": view["depth"], "in_flight": view["in_flight"],
                    "consumers": view["consumers"], "gone": 0}
        except APIError as e:
            assert e.status == 404
            have = {"gone": 1}
        if all(have.get(k) == v for k, v in want.items()):
            return
        assert time.monotonic() < deadline, (queue, want, have)
        yield deferLater(reactor, 0.05, lambda: None)


@pytest_twisted.inlineCallbacks
def test_every_queue_of_a_mixed_workload_balances(spark, tmp_path, journaled_server, capsys):
    journal = tmp_path / "journal"
    ports = journaled_server(journal, "mqks", "phpmq", "http", args=(f"--http-token={TOKEN}",))
    http = HTTPClient(f"http://127.0.0.1:{ports['http']}", token=TOKEN, http=TreqClient(
        Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))))
    pub = Lines(ports["mqks"])

    # orders: acks, a reject redelivered and acked, a disconnect, two held at shutdown
    c1 = Lines(ports["mqks"])
    c1.send("c1 consume --confirm orders ev.order --manual-ack")
    assert c1.read(1) == ["c1 ok "]
    pub.send(*(f"o{n} publish ev.order body{n}" for n in range(10)))
    assert len(c1.read(10)) == 10
    c1.send(*(f"a{n} ack --confirm c1 o{n}" for n in range(6)))
    assert c1.read(6) == [f"a{n} ok " for n in range(6)]
    c1.send("r6 reject --confirm c1 o6")
    assert sorted(c1.read(2)) == ["c1 ok o6 event=ev.order,retry=1 body6", "r6 ok "]
    c1.send("a6 ack --confirm c1 o6")
    assert c1.read(1) == ["a6 ok "]
    c1.sock.close()  # o7, o8, o9 go back
    c2 = Lines(ports["mqks"])
    c2.send("c2 consume --confirm orders --manual-ack")
    assert len(c2.read(4)) == 4  # three deliveries and the ok
    c2.send("a7 ack --confirm c2 o7")
    assert c2.read(1) == ["a7 ok "]

    # auto: a consumer without manual ack
    c3 = Lines(ports["mqks"])
    c3.send("c3 consume --confirm auto ev.auto")
    assert c3.read(1) == ["c3 ok "]
    pub.send(*(f"x{n} publish ev.auto body" for n in range(3)))
    assert len(c3.read(3)) == 3

    # tmp: deleted over MQKS while its consumer holds four deliveries
    c4 = Lines(ports["mqks"])
    c4.send("c4 consume --confirm tmp ev.tmp --manual-ack")
    assert c4.read(1) == ["c4 ok "]
    pub.send(*(f"t{n} publish ev.tmp body" for n in range(5)))
    assert len(c4.read(5)) == 5
    c4.send("k0 ack --confirm c4 t0")
    assert c4.read(1) == ["k0 ok "]
    pub.send("d1 delete_queue --confirm tmp")
    assert pub.read(1) == ["d1 ok "]
    assert c4.read(1)[0].startswith("c4 ok --update tmp")

    # scratch: its consumer leaves holding two, the queue goes when unused
    c5 = Lines(ports["mqks"])
    c5.send("c5 consume --confirm scratch ev.scratch --delete-queue-when-unused=0 --manual-ack")
    assert c5.read(1) == ["c5 ok "]
    pub.send(*(f"s{n} publish ev.scratch body" for n in range(3)))
    assert len(c5.read(3)) == 3
    c5.send("k1 ack --confirm c5 s0")
    assert c5.read(1) == ["k1 ok "]
    c5.sock.close()
    yield until(http, "scratch", gone=1)

    # jobs: over HTTP, two run out of retries into jobs.dead, which is purged
    yield http.create_queue("jobs", dead_letter="jobs.dead")
    for n in range(4):
        yield http.publish("jobs", f"job {n}", message_id=f"j{n}",
                           headers={"x-max-retries": "0"} if n < 2 else None)
    taken = yield http.consume("jobs", max=4)
    assert [m["id"] for m in taken["messages"]] == ["j0", "j1", "j2", "j3"]
    consumer = taken["consumer"]
    yield http.reject("jobs", consumer, ["j0", "j1"])
    yield http.ack("jobs", consumer, ["j2"])
    yield http.reject("jobs", consumer, ["j3"])
    yield until(http, "jobs.dead", depth=2)
    yield http.create_queue("replay")
    moved = yield http.move("jobs.dead", "replay", limit=1)
    assert moved["moved"] == 1
    purged = yield http.purge("jobs.dead")
    assert purged["purged"] == 1

    # pq: PHPMQ with TTLs, an ack, a 006, a 005 and a disconnect
    php = PHPMQ(ports["phpmq"])
    php.sock.sendall(codec.publish(b"pq", b"p0", ttl=1) + codec.publish(b"pq", b"p1", ttl=1)
                     + b"".join(codec.publish(b"pq", b"p%d" % n) for n in range(2, 6)))
    yield until(http, "pq", expired=2)
    php.sock.sendall(codec.consume(b"pq", 4))
    ids = php.read(4)
    assert sorted(ids) == [b"p2", b"p3", b"p4", b"p5"]
    php.sock.sendall(codec.ack(b"pq", ids[b"p2"]) + codec.dead_letter(b"pq", ids[b"p3"])
                     + codec.requeue(b"pq", ids[b"p5"], 0) + codec.ack(b"pq", ids[b"p4"]))
    yield until(http, "pq", acked=2, dead_lettered=1, rejected=1, in_flight=1)
    php.sock.close()  # p5, redelivered, goes back again
    yield until(http, "pq", consumers=0, depth=1)

    # pdel: deleted over HTTP while a PHPMQ consumer (window 2) holds two
    php2 = PHPMQ(ports["phpmq"])
    php2.sock.sendall(b"".join(codec.publish(b"pdel", b"d%d" % n) for n in range(5))
                      + codec.consume(b"pdel", 2))
    assert len(php2.read(2)) == 2
    yield http.delete_queue("pdel")

    # capped: max_length 2, drop-head without a dead-letter target
    yield http.create_queue("capped", max_length=2)
    for n in range(5):
        yield http.publish("capped", "c", message_id=f"c{n}")

    yield until(http, "orders", acked=8, in_flight=2)
    for client in (pub, c2, c3, c4, php2):
        client.sock.close()
    journaled_server.stop()  # graceful: c2's two deliveries are requeued, the journal sealed
    assert not list(journal.glob("date=*/*.open"))

    out = tmp_path / "out"
    assert cli.main(["--journal", str(journal), "--out", str(out), "--reports", "balance",
                     "--html"]) == 0
    text = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "summary.json").read_text())["balance"]
    rows = {row["queue"]: row for row in summary["queues"]}
    assert {queue: tuple(row[t] for t in TERMS) for queue, row in rows.items()} == EXPECTED
    assert all(row["balanced"] and row["unmatched"] == 0 for row in rows.values())
    assert summary["balanced"] and summary["unbalanced_queues"] == []
    # at the end every copy still there is ready: the shutdown requeued what was held
    assert {(q, row["ready"], row["in_flight"]) for q, row in rows.items() if row["still_there"]} \
        == {("orders", 2, 0), ("jobs", 1, 0), ("replay", 1, 0), ("pq", 1, 0), ("capped", 2, 0)}
    assert text[-1] == "balance: all 10 queues balance"
    assert "balance: all 10 queues balance" in (out / "report.html").read_text()

    records = [json.loads(line) for path in sorted(journal.glob("date=*/*.jsonl"))
               for line in path.read_text().splitlines()]
    ends = Counter((r["queue"], r["event"], r.get("reason"), "consumer" in r) for r in records
                   if r["event"] in ("deleted", "purged", "moved", "consumer_closed"))
    assert {k: v for k, v in ends.items() if k[1] != "consumer_closed"} == {
        ("tmp", "deleted", "queue_deleted", True): 4,
        ("scratch", "deleted", "unused", False): 2,
        ("jobs.dead", "moved", "moved", False): 1,
        ("jobs.dead", "purged", None, False): 1,
        ("pdel", "deleted", "queue_deleted", True): 2,
        ("pdel", "deleted", "queue_deleted", False): 3,
    }
    assert ends[("tmp", "consumer_closed", "queue_deleted", True)] == 1
    assert ends[("pdel", "consumer_closed", "queue_deleted", True)] == 1
