"""PHPMQ against the real server: twistd subprocess, raw TCP sockets, and a PHP client."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import Frame, FrameDecoder

PHP_CLIENT = Path(__file__).resolve().parents[1] / "php" / "phpmq_client.php"
LISTEN = "tcp:0:interface=127.0.0.1"
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


class FrameClient:
    """A raw-socket PHPMQ client: send frames, read frames with a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def _fill(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed; have {self.frames!r}")
        self.decoder.feed(chunk)
        while (frame := self.decoder.next_frame()) is not None:
            self.frames.append(frame)
        return True

    def read(self, count: int, timeout: float = 10.0) -> list[Frame]:
        deadline = time.monotonic() + timeout
        while len(self.frames) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"wanted {count} frames, have {self.frames!r}")
            self._fill(remaining)
        got, self.frames = self.frames[:count], self.frames[count:]
        return got

    def bodies(self, count: int) -> list[bytes]:
        return [f.packages[codec.CONTENT] for f in self.read(count)]

    def quiet(self, wait: float = 0.3) -> bool:
        """True if nothing arrives within ``wait`` seconds."""
        try:
            self._fill(wait)
        except TimeoutError:
            return not self.frames and not self.decoder.buffered()
        return False

    def closed(self, timeout: float = 10.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self) -> None:
        self.sock.close()


def logged(server, text: str, timeout: float = 10.0) -> bool:
    """Whether the server logs ``text`` within ``timeout``: its log is read by a thread,
    which may not have seen a line yet when the client already sees the close."""
    deadline = time.monotonic() + timeout
    while text not in server.text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def clients() -> Iterator:
    made: list[FrameClient] = []

    def make(port: int) -> FrameClient:
        client = FrameClient(port)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def server(start_server):
    return start_server(f"--protocol=phpmq:{LISTEN}")


@pytest.fixture
def connect(server, clients):
    return lambda: clients(server.ports["phpmq"])


def test_publish_consume_window_ack_with_ttl(connect):
    publisher, consumer = connect(), connect()
    publisher.send(*(codec.publish(b"Foo", b"msg %d" % n, 3600) for n in range(3)))
    consumer.send(codec.publish(b"warm-up", b"reveals revision 2018", 0), codec.consume(b"Foo", 2))
    first, second = consumer.read(2)
    assert [first.packages[2], second.packages[2]] == [b"msg 0", b"msg 1"]
    assert len(first.packages) == 4 and 3590 <= int(first.packages[codec.TTL]) <= 3600
    assert consumer.quiet()
    consumer.send(codec.ack(b"Foo", first.packages[codec.MESSAGE_ID]))
    assert consumer.bodies(1) == [b"msg 2"]
    assert publisher.quiet(0.1)


def test_frames_split_anywhere_and_several_per_segment(connect):
    c = connect()
    wire = b"".join(codec.publish(b"q", b"part %d" % n) for n in range(5)) + codec.consume(b"q", 9)
    for i in range(0, len(wire), 7):
        c.send(wire[i : i + 7])
    assert c.bodies(5) == [b"part %d" % n for n in range(5)]


def test_malformed_frame_closes_only_that_connection(connect, server):
    good, bad = connect(), connect()
    good.send(codec.consume(b"q", 5))
    bad.send(codec.publish(b"q", b"before"), b"GET / HTTP/1.1\r\n\r\n")
    assert bad.closed()
    assert good.bodies(1) == [b"before"]
    good.send(codec.publish(b"q", b"still alive"))
    assert good.bodies(1) == [b"still alive"]
    assert logged(server, "closed by the server: malformed frame: bad message header flag b'G'")


def test_oversized_content_is_refused(start_server, clients):
    server = start_server(f"--protocol=phpmq:{LISTEN}", "--phpmq-max-content=1000")
    c = clients(server.ports["phpmq"])
    c.send(codec.message_header(codec.PUBLISH, 2), codec.package_header(codec.QUEUE, 1), b"q",
           codec.package_header(codec.CONTENT, 10**9))
    assert c.closed()
    assert logged(server, "content length 1000000000 above the limit of 1000")


def test_disconnect_returns_unacked_in_order_to_another_consumer(connect):
    a, b = connect(), connect()
    a.send(*(codec.publish(b"q", b"%d" % n) for n in range(4)), codec.consume(b"q", 3))
    assert a.bodies(3) == [b"0", b"1", b"2"]
    b.send(codec.consume(b"q", 10))
    assert b.bodies(1) == [b"3"]
    a.close()
    assert b.bodies(3) == [b"0", b"1", b"2"]


def test_requeue_and_dead_letter_with_a_dead_letter_queue(start_server, clients):
    server = start_server(f"--protocol=phpmq:{LISTEN}", "--phpmq-dead-letter-suffix=.dead")
    c, d = clients(server.ports["phpmq"]), clients(server.ports["phpmq"])
    c.send(codec.publish(b"q", b"a"), codec.publish(b"q", b"b"), codec.consume(b"q", 1))
    [a] = c.read(1)
    c.send(codec.requeue(b"q", a.packages[3], 0))
    [b] = c.read(1)
    c.send(codec.dead_letter(b"q", b.packages[3]))
    assert c.bodies(1) == [b"a"]
    d.send(codec.consume(b"q.dead", 5))
    [dead] = d.read(1)
    assert (dead.packages[2], dead.packages[3]) == (b"b", b.packages[3])


@pytest.fixture
def both(start_server):
    return start_server(f"--protocol=phpmq:{LISTEN}", f"--protocol=mqks:{LISTEN}")


def test_phpmq_publish_is_consumed_over_mqks(both, clients, line_client):
    mqks = line_client(both.ports["mqks"])
    mqks.send("c consume --confirm Foo --manual-ack")
    assert mqks.read(1) == [b"c ok "]
    clients(both.ports["phpmq"]).send(codec.publish(b"Foo", b"Hello World", 3600))
    [line] = mqks.read(1)
    assert line.startswith(b"c ok ") and line.endswith(b" event=Foo Hello World")
    message_id = line.split(b" ")[2]
    assert len(message_id) == 32
    mqks.send(f"a ack --confirm c {message_id.decode()}")
    assert mqks.read(1) == [b"a ok "]


def test_mqks_publish_is_consumed_over_phpmq(both, clients, line_client):
    mqks = line_client(both.ports["mqks"])
    mqks.send("r rebind --confirm Foo greeting")
    assert mqks.read(1) == [b"r ok "]
    mqks.send("m1 publish --confirm greeting hello from mqks")
    assert mqks.read(1) == [b"m1 ok "]
    phpmq = clients(both.ports["phpmq"])
    phpmq.send(codec.consume(b"Foo", 1))
    [frame] = phpmq.read(1)
    assert frame.packages == {1: b"Foo", 2: b"hello from mqks", 3: b"m1"}
    phpmq.send(codec.ack(b"Foo", b"m1"))
    assert phpmq.quiet()


def test_help_lists_the_phpmq_options(tmp_path):
    out = subprocess.run(
        [TWISTD, "mqserver", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0
    help_text = " ".join(out.stdout.split())  # --help wraps wherever the lines fall
    for text in ("phpmq (tcp:9100:interface=127.0.0.1)", "--phpmq-max-content",
                 "--phpmq-dead-letter-suffix", "--phpmq-revision"):
        assert text in help_text


@pytest.mark.skipif(
    shutil.which("php") is None,
    reason="php is not installed (apt-get install php-cli; .ci/run does this)",
)
def test_the_php_client_script(server):
    out = subprocess.run(
        ["php", str(PHP_CLIENT), "127.0.0.1", str(server.ports["phpmq"])],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.endswith("done\n")
    for check in ("window of 2 holds the third message back", "requeued message keeps its id",
                  "nothing left after ack and dead letter", "legacy queue drained"):
        assert f"ok {check}" in out.stdout
