"""The database's own failover under ``--ha`` nodes (issue 18 item 5).

A PostgreSQL primary with a synchronous streaming replica on loopback
(``pg_basebackup``, ``synchronous_standby_names``), two mqserver nodes given
a multi-host DSN with ``target_session_attrs=read-write``.  Under a stream of
confirmed MQKS publishes the primary is killed with ``kill -9`` and the
replica promoted: the active loses its session and stands by, a node comes
back on the promoted server, the publisher reconnects to it, and every
publish that was confirmed, before or after, is there.
"""

from __future__ import annotations

import threading
import time

import pytest

from mqserver.crashtest import http, mqks
from mqserver.crashtest.failover import HealthWatch, Node
from mqserver.crashtest.server import Lines
from mqserver.pgtesting import PostgresCluster, find_bindir

FAST = ("--ha-lease=2", "--ha-renew=0.5", "--ha-poll=0.2")


def active_ports(nodes: list[Node], marks: dict[str, int], timeout: float = 60.0
                 ) -> dict[str, int]:
    """The protocol ports of the node that is active now (opened after ``marks``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            ports = node.ports_since(marks[node.name])
            if "mqks" in ports and node.health()[0] == 200:
                return {**ports, "http": node.http}
        time.sleep(0.05)
    raise TimeoutError("no active node:\n" + "".join(
        line for node in nodes for line in node.server.output[-30:]))


class Publisher:
    """``publish --confirm`` in a loop; reconnects to the active node whenever cut off."""

    def __init__(self, nodes: list[Node], marks: dict[str, int]) -> None:
        self.nodes = nodes
        self.marks = marks
        self.confirmed: set[str] = set()
        self.confirm_times: list[float] = []
        self.reconnects = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                lines = Lines(active_ports(self.nodes, self.marks)["mqks"])
            except (OSError, TimeoutError):
                continue
            while not self.stop.is_set():
                mids = [f"m{n + i}" for i in range(20)]
                n += 20
                if not lines.send(b"".join(b"%s publish --confirm ev %s\n"
                                           % (mid.encode(), mqks.body_of(mid))
                                           for mid in mids)):
                    break
                waiting = {mid.encode() for mid in mids}
                while waiting:
                    got = lines.lines(10.0)
                    if not got:  # cut off (None) or silent: reconnect
                        break
                    for line in got:
                        mid, _, rest = line.partition(b" ")
                        if rest.startswith(b"ok") and mid in waiting:
                            self.confirmed.add(mid.decode())
                            self.confirm_times.append(time.monotonic())
                        waiting.discard(mid)
                if waiting:
                    break
                time.sleep(0.01)
            lines.close()
            self.reconnects += 1


def test_primary_killed_replica_promoted_nothing_confirmed_lost(tmp_path):
    if find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries: `make postgres-setup` (.ci/run) installs them")
    primary = PostgresCluster.create()
    replica = None
    nodes: list[Node] = []
    try:
        replica = primary.replica("replica1", synchronous=True)
        dsn = (f"host=127.0.0.1,127.0.0.1 port={primary.port},{replica.port} user=postgres "
               "dbname=postgres target_session_attrs=read-write")
        args = ["--storage=postgres", f"--postgres-dsn={dsn}", f"--data-dir={tmp_path}", *FAST]
        nodes.append(Node("a", args, tmp_path))
        marks = {"a": 0, "b": 0}
        ports = active_ports(nodes, marks)
        nodes.append(Node("b", args, tmp_path))
        http.Client(ports["http"]).call("PUT", "/api/queues/q", {"bindings": ["ev"]})
        publisher = Publisher(nodes, marks)
        watch = HealthWatch(nodes)
        publisher.thread.start()
        deadline = time.monotonic() + 30
        while len(publisher.confirmed) < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(publisher.confirmed)
        assert before >= 500
        for node in nodes:
            marks[node.name] = len(node.server.output)
        primary.kill()  # kill -9 of the postmaster and every backend, waited for
        killed = time.monotonic()
        replica.promote()
        promoted = time.monotonic()
        active_ports(nodes, marks)
        deadline = time.monotonic() + 30
        while len(publisher.confirmed) < before + 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        publisher.stop.set()
        publisher.thread.join(20)
        watch.close()
        assert len(publisher.confirmed) >= before + 500, "no confirms after the promotion"
        first = min(t for t in publisher.confirm_times if t > killed)
        print(f"database failover: primary dead to the first confirmed publish on the "
              f"promoted replica: {first - killed:.2f} s (promotion {promoted - killed:.2f} s)")
        assert publisher.reconnects >= 1
        assert watch.overlaps == []
        output = "".join(line for node in nodes for line in node.server.output)
        assert "no longer active" in output
        assert f":{replica.port}/postgres" in output  # a node opened the promoted server
        found, garbled = mqks.drain(active_ports(nodes, marks)["mqks"], ["q"],
                                    {("q", mid) for mid in publisher.confirmed})
        lost = {mid for mid in publisher.confirmed if ("q", mid) not in found}
        assert not lost, f"{len(lost)} confirmed publishes lost, e.g. {sorted(lost)[:5]}"
        assert not garbled
        assert all(count == 1 for count in found.values())
    finally:
        for node in nodes:
            node.stop()
        if replica is not None:
            replica.destroy()
        primary.destroy()
