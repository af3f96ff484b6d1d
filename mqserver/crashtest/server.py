"""The server under test, ``twistd -n mqserver`` on ephemeral ports, and a line socket."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

LISTENING = re.compile(r"([\w-]+) listening on [\d.]+:(\d+)")
TOKEN = "crashtest-token"

LISTENERS = [
    "--protocol=mqks:tcp:0:interface=127.0.0.1",
    "--protocol=phpmq:tcp:0:interface=127.0.0.1",
    "--phpmq-revision=2018",
    "--protocol=emqp:tcp:0:interface=127.0.0.1",
    "--emqp-backend=tcp:0:interface=127.0.0.1",
    "--emqp-admin=tcp:0:interface=127.0.0.1",
    "--http=tcp:0:interface=127.0.0.1",
    f"--http-token={TOKEN}",
]
"""Every protocol on an ephemeral port: servers started one after the other never clash."""

EXPECTED = {"mqks", "phpmq", "emqp", "emqp-backend", "http"}


class ServerProcess:
    """``twistd -n mqserver`` with every listener on loopback; its output kept for reports."""

    def __init__(self, args: list[str], workdir: Path, timeout: float = 30.0,
                 expected: set[str] = EXPECTED, listeners: list[str] = LISTENERS) -> None:
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.output: list[str] = []
        self.ports: dict[str, int] = {}
        self.process = subprocess.Popen(
            [twistd, "-n", "--pidfile=", "mqserver", "--no-gc-tuning", *listeners, *args],
            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self._ready = threading.Event()
        self.expected = expected  # listeners that make it ready (a standby has only http)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or not set(self.ports) >= expected:
            self.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.output))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            match = LISTENING.search(line)
            if match:
                self.ports[match.group(1)] = int(match.group(2))
                if set(self.ports) >= self.expected:
                    self._ready.set()
        self._ready.set()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


class Lines:
    """A socket that yields complete lines; ``None`` once the peer is gone."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._buffer = b""
        self._lock = threading.Lock()

    def send(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def lines(self, timeout: float) -> list[bytes] | None:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 16)
        except TimeoutError:
            return []
        except OSError:
            return None
        if not chunk:
            return None
        data = self._buffer + chunk
        *complete, self._buffer = data.split(b"\n")
        return complete

    def expect(self, wanted: bytes, timeout: float = 30.0) -> bool:
        """Read until the line ``wanted``; False if the peer went away or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.lines(0.5)
            if lines is None:
                return False
            if wanted in lines:
                return True
        return False

    def close(self) -> None:
        self.sock.close()
