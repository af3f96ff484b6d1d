"""eMQP servers and stock pyzmq DEALER peers for the integration tests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import zmq

V = b"eMQP/1.0"
EMQP_ARGS = (
    "--protocol=emqp:tcp:0:interface=127.0.0.1",
    "--emqp-backend=tcp:0:interface=127.0.0.1",
    "--emqp-admin=tcp:0:interface=127.0.0.1",
)
LABELS = ("emqp", "emqp-backend", "emqp-admin")


def poll(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    """Poll ``condition`` until it is truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Dealer:
    """A pyzmq DEALER speaking eMQP frames, with deadlines on every receive."""

    def __init__(self, context, port: int, identity: bytes | None = None) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.connect(f"tcp://127.0.0.1:{port}")

    def send(self, command: bytes, *body: bytes, msgid: bytes | None = None) -> bytes:
        msgid = msgid or str(uuid.uuid4()).encode()
        self.socket.send_multipart([b"", V, command, msgid, *body])
        return msgid

    def recv(self, timeout: float = 10.0, skip: tuple[bytes, ...] = (b"HEARTBEAT",)) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.socket.poll(int(remaining * 1000)):
                raise TimeoutError("no message within the deadline")
            frames = self.socket.recv_multipart()
            if frames[2] not in skip:
                return frames

    def quiet(self, wait: float = 0.5, skip: tuple[bytes, ...] = (b"HEARTBEAT",)) -> bool:
        try:
            frames = self.recv(wait, skip)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected message {frames!r}")

    def inform(self, queues: bytes = b"", kind: bytes = b"worker") -> list[bytes]:
        msgid = self.send(b"INFORM", queues, kind)
        ack = self.recv()
        assert ack[2] == b"ACK" and ack[4] == msgid
        return ack

    def admin(self, command: bytes) -> dict:
        self.send(command)
        reply = self.recv(skip=(b"HEARTBEAT", b"ACK"))
        assert reply[2] == b"REPLY"
        return json.loads(reply[4])

    def close(self) -> None:
        self.socket.close(0)


@pytest.fixture
def wait_for() -> Callable:
    """``wait_for(condition, timeout=10, what=...)``: poll with a deadline."""
    return poll


@pytest.fixture
def zmq_context() -> Iterator:
    context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def start_emqp(start_server):
    """Start ``twistd mqserver`` with eMQP on ephemeral ports and wait for all three."""

    def start(*args: str):
        server = start_server(*EMQP_ARGS, *args)
        poll(lambda: set(LABELS) <= set(server.ports), what="three eMQP listeners")
        return server

    return start


@pytest.fixture
def dealers(zmq_context) -> Iterator:
    """Make DEALERs on any port; all are closed at the end."""
    made: list[Dealer] = []

    def make(port: int, identity: bytes | None = None) -> Dealer:
        dealer = Dealer(zmq_context, port, identity)
        made.append(dealer)
        return dealer

    yield make
    for dealer in made:
        dealer.close()
