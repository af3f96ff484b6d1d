"""Overload against the real server: slow consumers, full queues, the memory alarm.

A consumer that never reads must not make the server buffer everything for
it: deliveries pause, the rest waits in the queue, and the server's memory
stays near what the queue itself holds.  ``MQSERVER_OVERLOAD_MB`` (default
200) sets how much the slow-consumer tests publish.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from mqserver.protocols.phpmq import codec as phpmq
from mqserver.protocols.phpmq.codec import FrameDecoder

LISTEN = "tcp:0:interface=127.0.0.1"
TOTAL = int(os.environ.get("MQSERVER_OVERLOAD_MB", "200")) * 1024 * 1024
BODY_SIZE = 128 * 1024
COUNT = TOTAL // BODY_SIZE
# what may sit between the broker and a client that reads nothing: one turn's
# output mark (256 KiB), the transport's buffer (64 KiB) and the kernel's
# socket buffers on both ends (loopback autotuning goes up to a few MiB)
IN_TRANSIT_BOUND = 16 * 1024 * 1024


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def http_json(port: int, path: str, method: str = "GET", body: object = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method,
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def slow_socket(port: int) -> socket.socket:
    """A client socket with a small receive buffer, as a slow consumer's would be."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(60)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(1 << 20, size - got))
        if not chunk:
            raise ConnectionError(f"closed after {got} of {size} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@pytest.fixture
def server(start_server):
    return start_server(
        f"--protocol=mqks:{LISTEN}", f"--protocol=phpmq:{LISTEN}", f"--http={LISTEN}",
        "--http-token=t", "--storage=memory", "--memory-high-watermark=0",
    )


def queue(server, name: str) -> dict:
    status, view = http_json(server.ports["http"], f"/api/queues/{name}")
    assert status == 200
    return view


def check_bounded(server, name: str, baseline_kib: int) -> None:
    view = queue(server, name)
    in_transit = view["counters"]["delivered"] * BODY_SIZE
    assert in_transit <= IN_TRANSIT_BOUND, view["counters"]
    assert view["depth"] >= COUNT - IN_TRANSIT_BOUND // BODY_SIZE
    grown = (status_kib(server.process.pid, "VmHWM") - baseline_kib) * 1024
    # the queue holds TOTAL; buffering it again for the client would double that
    assert grown < TOTAL * 1.5, f"peak RSS grew by {grown >> 20} MiB for {TOTAL >> 20} MiB"
    print(f"{name}: {COUNT} x {BODY_SIZE} B published, {view['counters']['delivered']} "
          f"delivered to the client that does not read, peak RSS +{grown >> 20} MiB")


def test_mqks_slow_consumer_is_paused_and_later_gets_everything(server, line_client):
    port = server.ports["mqks"]
    consumer = slow_socket(port)
    consumer.sendall(b"c1 consume --confirm q ev\n")
    assert recv_exactly(consumer, len(b"c1 ok \n")) == b"c1 ok \n"
    baseline = status_kib(server.process.pid, "VmRSS")
    producer = line_client(port)
    body = b"b" * (BODY_SIZE - 8)
    for n in range(COUNT):
        producer.sock.sendall(b"p%d publish ev %08d%s\n" % (n, n, body))
    producer.send("sync ping done")
    assert producer.read(1, timeout=120) == [b"sync ok done"]
    check_bounded(server, "q", baseline)
    # now the consumer reads: everything arrives, in order
    prefix = b"c1 ok "
    buffer = b""
    for n in range(COUNT):
        while b"\n" not in buffer:
            buffer += consumer.recv(1 << 20)
        line, _, buffer = buffer.partition(b"\n")
        assert line.startswith(prefix + b"p%d event=ev %08d" % (n, n)), line[:60]
    assert queue(server, "q")["depth"] == 0
    consumer.close()


def test_phpmq_slow_consumer_is_paused_and_later_gets_everything(server):
    port = server.ports["phpmq"]
    consumer = slow_socket(port)
    consumer.sendall(phpmq.consume(b"jobs", COUNT + 10))
    wait_for(lambda: queue(server, "jobs")["consumers"] == 1, "the consumer to register")
    baseline = status_kib(server.process.pid, "VmRSS")
    producer = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = b"b" * (BODY_SIZE - 8)
    for n in range(COUNT):
        producer.sendall(phpmq.publish(b"jobs", b"%08d%s" % (n, body)))
    wait_for(lambda: (lambda v: v["depth"] + v["counters"]["delivered"])(queue(server, "jobs"))
             == COUNT, "every publish to be in")
    check_bounded(server, "jobs", baseline)
    decoder = FrameDecoder()
    got = 0
    while got < COUNT:
        decoder.feed(consumer.recv(1 << 20))
        while (frame := decoder.next_frame()) is not None:
            assert frame.packages[phpmq.CONTENT][:8] == b"%08d" % got
            got += 1
    producer.close()
    consumer.close()


def test_full_queue_refuses_over_every_protocol(start_server, line_client):
    server = start_server(
        f"--protocol=mqks:{LISTEN}", f"--protocol=phpmq:{LISTEN}", f"--http={LISTEN}",
        "--http-token=t", "--storage=memory", "--max-queue-length=2",
        "--overflow=reject-publish",
    )
    http = server.ports["http"]
    client = line_client(server.ports["mqks"])
    client.send("r1 rebind --confirm q ev")
    assert client.read(1) == [b"r1 ok "]
    client.send("m1 publish ev one", "m2 publish ev two", "m3 publish --confirm ev three",
                "sync ping x")
    first, second = client.read(2)
    assert first.startswith(b"m3 error ") and second == b"sync ok x"
    status, answer = http_json(http, "/api/events/ev", "POST", {"body": "four"})
    assert status == 507 and "is full" in answer["error"]
    producer = socket.create_connection(("127.0.0.1", server.ports["phpmq"]), timeout=10)
    producer.sendall(phpmq.publish(b"q", b"five"))
    wait_for(lambda: queue(server, "q")["counters"]["refused"] == 3, "the PHPMQ refusal")
    status, view = http_json(http, "/api/queues/q")
    assert view["depth"] == 2 and view["options"]["overflow"] is None
    # a queue of its own choosing: drop-head keeps the newest two
    status, _ = http_json(http, "/api/queues/q", "PUT", {"overflow": "drop-head"})
    assert status == 200
    client.send("m4 publish --confirm ev six")
    assert client.read(1) == [b"m4 ok "]
    status, peek = http_json(http, "/api/queues/q/messages?limit=5")
    assert [m["body"] for m in peek["messages"]] == ["two", "six"]
    producer.close()


def test_overflow_policy_survives_a_restart(start_server, tmp_path):
    args = (f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", "--http-token=t",
            f"--data-dir={tmp_path / 'data'}")
    for storage in ("sqlite", "log"):
        server = start_server(*args, f"--storage={storage}")
        status, _ = http_json(server.ports["http"], f"/api/queues/{storage}", "PUT",
                              {"max_length": 1, "overflow": "reject-publish"})
        assert status == 201
        server.stop()
        server = start_server(*args, f"--storage={storage}")
        view = queue(server, storage)
        assert view["options"]["overflow"] == "reject-publish"
        assert view["options"]["max_length"] == 1
        server.stop()


def test_memory_alarm_stops_reading_publishers_until_consumers_drain(start_server, line_client):
    high = 192 * 1024 * 1024
    server = start_server(
        f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", "--http-token=t", "--storage=memory",
        f"--memory-high-watermark={high}", "--memory-check-interval=0.05",
    )
    http, port = server.ports["http"], server.ports["mqks"]
    body = b"b" * (64 * 1024 - 8)
    count = (high + 128 * 1024 * 1024) // (64 * 1024)  # more than fits under the mark
    producer = line_client(port)
    producer.send("r1 rebind --confirm q ev")
    assert producer.read(1) == [b"r1 ok "]
    sent = threading.Event()

    def publish() -> None:
        for n in range(count):
            producer.sock.sendall(b"p%d publish ev %08d%s\n" % (n, n, body))
        sent.set()

    producer.sock.settimeout(None)  # blocking while the server does not read
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    wait_for(lambda: http_json(http, "/health")[1]["status"] == "memory_alarm", "the alarm")
    status, health = http_json(http, "/health")
    assert status == 200 and health["memory"]["alarm"] is True
    assert not sent.is_set()
    held = queue(server, "q")["depth"]
    peak = status_kib(server.process.pid, "VmHWM") * 1024
    # reading stopped within about one check interval of passing the mark
    assert peak < high * 1.5, f"peak RSS {peak >> 20} MiB for a {high >> 20} MiB mark"
    # a consumer is still read: it consumes and acks everything, publishes resume
    consumer = line_client(port)
    consumer.send("c1 consume q --manual-ack")
    got = 0
    while got < count:
        for line in consumer.read(1, timeout=120):
            assert line.startswith(b"c1 ok p%d event=ev %08d" % (got, got)), line[:60]
            consumer.send(f"a{got} ack c1 p{got}")
            got += 1
    assert sent.wait(60)
    wait_for(lambda: http_json(http, "/health")[1]["status"] == "ok", "the alarm to clear")
    status, text = http_raw(http, "/metrics")
    alarms = re.search(rb"^mqserver_memory_alarms_total (\S+)$", text, re.M)
    assert alarms and float(alarms.group(1)) >= 1  # on again while publishes resumed: fine
    assert b"mqserver_memory_alarm 0.0" in text
    print(f"memory alarm: mark {high >> 20} MiB, {held} of {count} messages held when it "
          f"went on, peak RSS {peak >> 20} MiB; all {count} delivered, alarm on "
          f"{alarms.group(1).decode()} times")


def http_raw(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.read()


def test_connection_limits_and_idle_timeouts(start_server, line_client):
    server = start_server(
        f"--protocol=mqks:{LISTEN}", "--storage=memory", "--max-connections-per-ip=2",
        "--limit-loopback-per-ip", "--mqks-idle-timeout=2",
    )
    port = server.ports["mqks"]
    first, second = line_client(port), line_client(port)
    for client in (first, second):  # both accepted before the third connects
        client.send("p ping x")
        assert client.read(1) == [b"p ok x"]
    third = line_client(port)
    assert third.read(1)[0].startswith(b"None error ")
    assert third.closed()
    wait_for(lambda: "refused: 2 connections open from 127.0.0.1" in server.text(),
             "the refusal in the log")
    # neither says anything more: both are closed once idle, which makes room again
    assert first.closed() and second.closed()
    wait_for(lambda: server.text().count("closed: idle for 2.0 s") == 2, "the idle closes")
    again = line_client(port)
    again.send("p ping x")
    assert again.read(1) == [b"p ok x"]


def refusals(port: int) -> dict[str, float]:
    """``mqserver_connections_refused_total`` by reason ({} while the request is refused)."""
    try:
        _, text = http_raw(port, "/metrics")
    except (urllib.error.URLError, ConnectionError):
        return {}
    found = re.findall(rb'mqserver_connections_refused_total\{reason="(\w+)"\} ([\d.]+)', text)
    return {reason.decode(): float(value) for reason, value in found}


def test_loopback_clients_are_exempt_from_the_per_ip_limit_and_refusals_counted(
        start_server, line_client):
    """Every client here comes from 127.0.0.1: by default only --max-connections
    bounds them; --limit-loopback-per-ip counts them as one IP again."""
    server = start_server(f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", "--storage=memory",
                          "--max-connections-per-ip=3", "--max-connections=20")
    port = server.ports["mqks"]
    clients = [line_client(port) for _ in range(20)]  # far over 3 from one IP
    for client in clients:
        client.send("p ping x")
    assert all(client.read(1) == [b"p ok x"] for client in clients)
    over = line_client(port)  # the 21st in all
    assert over.read(1)[0].startswith(b"None error ") and over.closed()
    clients.pop().close()
    wait_for(lambda: "refused: 20 connections open (--max-connections 20)" in server.text(),
             "the refusal in the log")
    wait_for(lambda: refusals(server.ports["http"]) == {"max_connections": 1,
                                                        "max_connections_per_ip": 0},
             "the refusal in /metrics", timeout=10)

    strict = start_server(f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", "--storage=memory",
                          "--max-connections-per-ip=3", "--limit-loopback-per-ip")
    port = strict.ports["mqks"]
    clients = [line_client(port) for _ in range(3)]
    for client in clients:
        client.send("p ping x")
        assert client.read(1) == [b"p ok x"]
    over = line_client(port)
    assert over.read(1)[0].startswith(b"None error ") and over.closed()
    for client in clients:  # the HTTP request below comes from 127.0.0.1 too
        client.close()
    wait_for(lambda: "connections open from 127.0.0.1" in strict.text(), "the refusal")
    wait_for(lambda: refusals(strict.ports["http"]) == {"max_connections": 0,
                                                        "max_connections_per_ip": 1},
             "the per-IP refusal in /metrics", timeout=10)
