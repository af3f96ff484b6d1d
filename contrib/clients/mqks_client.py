#!/usr/bin/env python3
"""An MQKS client in plain Python: one TCP socket, one request per line.

No library: MQKS is text, so this is what a client in any language does.
It pings, binds a queue to an event with a manually acked consumer,
publishes (confirmed once durable), receives the delivery and acks it.

    python3 mqks_client.py [HOST] [PORT]      # default 127.0.0.1 25000

Prints one ``ok ...`` line per step and ``done``; exits 1 on the first
unexpected answer, so it doubles as a smoke test of a running server.
"""

from __future__ import annotations

import socket
import sys
import uuid


class MQKS:
    """A blocking line client; every read has a deadline so a silent server fails fast."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode("utf-8") + b"\n")

    def read(self) -> str:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8")

    def close(self) -> None:
        self.sock.close()


def expect(got: str, wanted: str, step: str) -> None:
    """Fail loudly with both lines: a mismatch is what this script exists to show."""
    if got != wanted:
        sys.exit(f"FAIL {step}: wanted {wanted!r}, got {got!r}")
    print(f"ok {step}")


def main(host: str, port: int) -> None:
    client = MQKS(host, port)
    client.send("p1 ping hello")
    expect(client.read(), "p1 ok hello", "ping")

    consumer = f"c-{uuid.uuid4().hex[:8]}"
    client.send(f"{consumer} consume --confirm example-greetings greeting --manual-ack")
    expect(client.read(), f"{consumer} ok ", "consume confirmed")

    message = f"m-{uuid.uuid4().hex[:8]}"
    client.send(f"{message} publish --confirm greeting hello from MQKS")
    # the delivery and the publish confirm may arrive in either order
    answers = sorted([client.read(), client.read()], key=lambda line: line.startswith(message))
    expect(answers[0], f"{consumer} ok {message} event=greeting hello from MQKS", "delivery")
    expect(answers[1], f"{message} ok ", "publish confirmed")

    client.send(f"a1 ack --confirm {consumer} {message}")
    expect(client.read(), "a1 ok ", "ack")
    client.send("d1 delete_queue --confirm example-greetings")
    expect(client.read(), f"{consumer} ok --update example-greetings --manual-ack",
           "consumer told the queue is gone")
    expect(client.read(), "d1 ok ", "queue deleted")
    client.close()
    print("done")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1",
         int(sys.argv[2]) if len(sys.argv) > 2 else 25000)
