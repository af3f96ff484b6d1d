"""Soak harness: hundreds of connections over every protocol, round after round, then a check.

Used by ``tests/integration/test_soak.py`` (bounded: ``MQSERVER_SOAK_SECONDS``,
default 20).  It talks to a running server over loopback only and needs
its ports and pid, nothing else.

Each round opens every session's connection first and holds them all at a
barrier (so hundreds are open at once), then each session does its part:

- MQKS producers publish ``--confirm`` to events bound to ``soak-a`` and
  ``soak-b``; MQKS consumers take from ``soak-a`` with manual ack, ack about
  half with ``ack --confirm`` and disconnect holding the rest;
- PHPMQ producers publish to ``soak-b`` (PHPMQ has no confirm); PHPMQ
  consumers take with a credit window, ack some and disconnect mid-delivery;
- eMQP clients (pyzmq DEALERs) send REQUESTs to ``default``, confirmed by the
  broker's answer once stored; eMQP workers INFORM, READY, take a few jobs
  (settled as they are sent) and vanish;
- HTTP publishers POST durable messages (201 = stored) to ``soak-a``'s event
  and straight into ``soak-b``.

Every body is a unique id, so between rounds ``settle`` takes what is left
with one MQKS consumer per queue, and ``Ledger.problems`` says whether
anything confirmed and never acked is missing, anything acked came back, or
anything arrived twice or out of nowhere; then it acks it all.  The server's
open descriptors and RSS are read from ``/proc`` once it is settled.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqserver.crashtest import Lines
from mqserver.protocols.phpmq import codec as phpmq

QUEUES = {b"soak-a": b"soak.a", b"soak-b": b"soak.b", b"default": None}
EMQP = b"eMQP/1.0"


@dataclass
class Ledger:
    """What the clients know: published, confirmed, ack sent, ack done (bodies)."""

    published: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    ack_sent: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def add(self, name: str, ids: list[bytes]) -> None:
        with self.lock:
            getattr(self, name).update(i.decode() for i in ids)

    def problems(self, drained: list[bytes]) -> list[str]:
        """Empty when the drained bodies are exactly what the ledger allows."""
        found: list[str] = []
        got = {body.decode() for body in drained}
        if len(got) != len(drained):
            found.append(f"{len(drained) - len(got)} messages drained twice")
        lost = self.confirmed - self.ack_sent - got
        if lost:
            found.append(f"{len(lost)} confirmed, unacked messages lost, e.g. {sorted(lost)[:3]}")
        back = got & self.acked
        if back:
            found.append(f"{len(back)} acked messages came back, e.g. {sorted(back)[:3]}")
        unknown = got - self.published
        if unknown:
            found.append(f"{len(unknown)} messages nobody published, e.g. {sorted(unknown)[:3]}")
        return found


@dataclass
class Resources:
    fds: int
    rss_kib: int


def resources(pid: int) -> Resources:
    """Open descriptors and resident memory of process ``pid`` (Linux ``/proc``)."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return Resources(fds, rss)


@dataclass
class Mix:
    """Sessions of each kind per round (defaults: 230 connections at once)."""

    mqks_producers: int = 30
    mqks_consumers: int = 40
    phpmq_producers: int = 20
    phpmq_consumers: int = 40
    emqp_clients: int = 30
    emqp_workers: int = 30
    http_publishers: int = 40
    messages: int = 8  # per producer session


class Soak:
    """Rounds of sessions against one server; see the module docstring."""

    def __init__(self, ports: dict[str, int], token: str, mix: Mix | None = None,
                 seed: int = 0) -> None:
        self.ports = ports
        self.token = token
        self.mix = mix or Mix()
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.rounds = 0
        self.settled = 0  # messages taken and acked by settle()
        self.errors: list[str] = []

    def _uid(self, kind: str, session: int, n: int) -> bytes:
        return f"{kind}{self.rounds}x{session}x{n}".encode()

    # -- set-up and the end check --------------------------------------------

    def declare(self) -> None:
        """Bind the event queues (MQKS ``rebind --confirm``): stored before any load."""
        client = Lines(self.ports["mqks"])
        try:
            for queue, event in QUEUES.items():
                if event is not None:
                    client.send(b"r rebind --confirm %s %s\n" % (queue, event))
                    _expect(client, lambda line: line == b"r ok ")
        finally:
            client.close()

    def settle(self, quiet: float = 1.0) -> list[str]:
        """Take everything left, check it against the ledger, then ack it all.

        Returns the problems found (``Ledger.problems``).  Emptying the queues
        keeps a long soak's backlog, and so the server's memory, bounded, and
        every later check also proves these acks stick.
        """
        drained: list[bytes] = []
        for queue in QUEUES:
            client = Lines(self.ports["mqks"])
            client.send(b"d consume --confirm %s --manual-ack\n" % queue)
            bodies = []
            while (lines := client.lines(quiet)):
                bodies.extend(line.rsplit(b" ", 1)[1] for line in lines
                              if line.startswith(b"d ok ") and line != b"d ok ")
            client.send(b"da ack --confirm d --all\n")
            _expect(client, lambda line: line == b"da ok ")
            client.close()
            drained.extend(bodies)
        problems = self.ledger.problems(drained)
        self.ledger.add("ack_sent", drained)
        self.ledger.add("acked", drained)
        self.settled += len(drained)
        return problems

    # -- rounds ---------------------------------------------------------------

    def run_round(self) -> None:
        """One round: every session connects, waits for the rest, works, and goes."""
        self.rounds += 1
        mix = self.mix
        plan: list[tuple[Callable[..., None], int]] = [
            (self._mqks_producer, mix.mqks_producers), (self._mqks_consumer, mix.mqks_consumers),
            (self._phpmq_producer, mix.phpmq_producers),
            (self._phpmq_consumer, mix.phpmq_consumers),
            (self._emqp_client, mix.emqp_clients), (self._emqp_worker, mix.emqp_workers),
            (self._http_publisher, mix.http_publishers),
        ]
        total = sum(count for _, count in plan)
        barrier = threading.Barrier(total, timeout=30)
        import zmq  # pyzmq comes with the test extra, not with the server

        context = zmq.Context()
        threads = [
            threading.Thread(target=self._session, args=(work, n, barrier, context), daemon=True)
            for work, count in plan for n in range(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        context.term()

    def _session(self, work: Callable[..., None], n: int, barrier: threading.Barrier,
                 context: Any) -> None:
        try:
            work(n, barrier, context)
        except Exception as e:  # a session's failure is reported, not fatal to the soak
            with self.ledger.lock:
                self.errors.append(f"{work.__name__} {n}: {e!r}")

    def _mqks_producer(self, n: int, barrier: threading.Barrier, _: Any) -> None:
        client = Lines(self.ports["mqks"])
        uids = [self._uid("mp", n, i) for i in range(self.mix.messages)]
        event = self.rng.choice([b"soak.a", b"soak.b"])
        barrier.wait()
        self.ledger.add("published", uids)
        client.send(b"".join(b"%s publish --confirm %s %s\n" % (u, event, u) for u in uids))
        oks = _collect(client, len(uids), lambda line: line.endswith(b" ok "))
        self.ledger.add("confirmed", [line[:-4] for line in oks])
        client.close()

    def _mqks_consumer(self, n: int, barrier: threading.Barrier, _: Any) -> None:
        client = Lines(self.ports["mqks"])
        cid = b"c%dx%d" % (self.rounds, n)
        barrier.wait()
        client.send(b"%s consume --confirm soak-a --manual-ack\n" % cid)
        prefix = cid + b" ok "
        got = _collect(client, 1 + self.rng.randint(1, 6), lambda line: line.startswith(prefix),
                       timeout=2.0)
        mids = [line.split(b" ", 3)[2] for line in got if line != prefix]
        acks = mids[: len(mids) // 2 + 1] if mids else []
        self.ledger.add("ack_sent", acks)
        client.send(b"".join(b"a%s ack --confirm %s %s\n" % (m, cid, m) for m in acks))
        done = _collect(client, len(acks), lambda line: line.startswith(b"a") and
                        line.endswith(b" ok "))
        self.ledger.add("acked", [line[1:-4] for line in done])
        client.close()  # the rest go back to the queue

    def _phpmq_producer(self, n: int, barrier: threading.Barrier, _: Any) -> None:
        sock = _connect(self.ports["phpmq"])
        uids = [self._uid("pp", n, i) for i in range(self.mix.messages)]
        barrier.wait()
        self.ledger.add("published", uids)
        sock.sendall(b"".join(phpmq.publish(b"soak-b", u) for u in uids))
        sock.close()

    def _phpmq_consumer(self, n: int, barrier: threading.Barrier, _: Any) -> None:
        sock = _connect(self.ports["phpmq"])
        barrier.wait()
        sock.sendall(phpmq.consume(b"soak-b", 5))
        decoder, frames = phpmq.FrameDecoder(), []
        deadline = time.monotonic() + 2.0
        want = self.rng.randint(1, 5)
        while len(frames) < want and time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                frames.append(frame)
        acks = frames[: len(frames) // 2]
        sock.sendall(b"".join(phpmq.ack(b"soak-b", f.packages[phpmq.MESSAGE_ID]) for f in acks))
        # sent before the close on one stream: the server applies them first
        bodies = [f.packages[phpmq.CONTENT] for f in acks]
        self.ledger.add("ack_sent", bodies)
        self.ledger.add("acked", bodies)
        sock.close()

    def _emqp_client(self, n: int, barrier: threading.Barrier, context: Any) -> None:
        dealer = _dealer(context, self.ports["emqp"])
        uids = [self._uid("ec", n, i) for i in range(self.mix.messages)]
        barrier.wait()
        self.ledger.add("published", uids)
        for uid in uids:
            dealer.send_multipart([b"", EMQP, b"REQUEST", uid, b"default", b"", uid])
        answers = _zmq_collect(dealer, len(uids), lambda m: m[2] == b"REPLY")
        self.ledger.add("confirmed", [m[4] for m in answers])
        dealer.close(0)

    def _emqp_worker(self, n: int, barrier: threading.Barrier, context: Any) -> None:
        dealer = _dealer(context, self.ports["emqp-backend"])
        dealer.send_multipart([b"", EMQP, b"INFORM", b"i", b'[[10, "default"]]', b"worker"])
        _zmq_collect(dealer, 1, lambda m: m[2] == b"ACK")
        barrier.wait()
        slots = self.rng.randint(1, 3)
        for _ in range(slots):
            dealer.send_multipart([b"", EMQP, b"READY", b"r"])
        jobs = _zmq_collect(dealer, slots, lambda m: m[2] == b"REQUEST", timeout=2.0)
        # untracked requests are settled as they are sent: taken means acked
        bodies = [m[-1] for m in jobs]
        self.ledger.add("ack_sent", bodies)
        self.ledger.add("acked", bodies)
        dealer.close(0)  # vanishes without KBYE

    def _http_publisher(self, n: int, barrier: threading.Barrier, _: Any) -> None:
        uids = [self._uid("hp", n, i) for i in range(self.mix.messages // 2)]
        paths = ["/api/events/soak.a", "/api/queues/soak-b/messages"]
        barrier.wait()
        self.ledger.add("published", uids)
        for uid in uids:
            body = json.dumps({"id": uid.decode(), "body": uid.decode(), "durable": True})
            if self._post(self.rng.choice(paths), body.encode()) == 201:
                self.ledger.add("confirmed", [uid])

    def _post(self, path: str, body: bytes) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports['http']}{path}", data=body, method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return int(e.code)


def _connect(port: int) -> Any:
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _dealer(context: Any, port: int) -> Any:
    import zmq

    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    return dealer


def _expect(client: Lines, wanted: Callable[[bytes], bool]) -> None:
    if not _collect(client, 1, wanted):
        raise AssertionError("no answer from the server")


def _collect(client: Lines, count: int, wanted: Callable[[bytes], bool],
             timeout: float = 10.0) -> list[bytes]:
    """Up to ``count`` lines that ``wanted`` accepts, within ``timeout`` seconds."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and (left := deadline - time.monotonic()) > 0:
        lines = client.lines(left)
        if lines is None:
            break
        got.extend(line for line in lines if wanted(line))
    return got


def _zmq_collect(dealer: Any, count: int, wanted: Callable[[list[bytes]], bool],
                 timeout: float = 10.0) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and (left := deadline - time.monotonic()) > 0:
        if not dealer.poll(int(left * 1000)):
            break
        frames = dealer.recv_multipart()
        if wanted(frames):
            got.append(frames)
    return got
