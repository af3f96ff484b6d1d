"""Start the real server, ``twistd -n mqserver``, as a subprocess on ephemeral ports."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

LISTENING = re.compile(r"([\w-]+) listening on ([\d.]+):(\d+)")
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


class Server:
    """A running ``twistd -n mqserver``; its log is collected for assertions."""

    def __init__(self, args: list[str], workdir: Path, timeout: float = 30.0) -> None:
        self.log: list[str] = []
        self.ports: dict[str, int] = {}
        self._seen = threading.Condition()
        http = any(a.startswith("--http=") for a in args)
        if not http and "--no-http" not in args:
            args = [*args, "--no-http"]  # the default :8080 would clash between servers
        self.process = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "mqserver", "--no-gc-tuning", *args],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        expected = {a.split(":")[0].split("=")[-1] for a in args if a.startswith("--protocol")}
        if http:
            expected.add("http")
        deadline = time.monotonic() + timeout
        with self._seen:
            while not expected <= set(self.ports):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server did not start:\n" + "".join(self.log))
                self._seen.wait(0.1)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._seen:
                self.log.append(line)
                match = LISTENING.search(line)
                if match:
                    self.ports[match.group(1)] = int(match.group(3))
                self._seen.notify_all()

    def text(self) -> str:
        """The log so far; once the process has exited, all of it."""
        if self.process.poll() is not None:
            self._reader.join(10)  # the reader may still hold the last lines
        with self._seen:
            return "".join(self.log)

    def wait_for_log(self, needle: str, timeout: float = 30.0) -> str:
        """The log once it contains ``needle``: the reader thread lags the server a little."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while needle not in "".join(self.log):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{needle!r} not logged:\n" + "".join(self.log))
                self._seen.wait(0.1)
            return "".join(self.log)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class LineClient:
    """A raw-socket MQKS client: send lines, read lines with a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, *lines: str | bytes) -> None:
        data = b"".join((x.encode() if isinstance(x, str) else x) + b"\n" for x in lines)
        self.sock.sendall(data)

    def read(self, count: int, timeout: float = 10.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while self.buffer.count(b"\n") < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"wanted {count} lines, have {self.buffer!r}")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed; have {self.buffer!r}")
            self.buffer += chunk
        lines = self.buffer.split(b"\n")
        self.buffer = b"\n".join(lines[count:])
        return lines[:count]

    def quiet(self, wait: float = 0.3) -> bool:
        """True if nothing arrives within ``wait`` seconds (polls with a deadline)."""
        self.sock.settimeout(wait)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return not self.buffer
        self.buffer += chunk
        return False

    def closed(self, timeout: float = 10.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buffer += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    servers: list[Server] = []

    def start(*args: str) -> Server:
        server = Server(list(args), tmp_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def mqks_server(start_server) -> Server:
    return start_server("--protocol=mqks:tcp:0:interface=127.0.0.1")


@pytest.fixture
def connect(mqks_server: Server, line_client) -> Callable[[], LineClient]:
    """MQKS LineClients to ``mqks_server``, closed at the end of the test."""
    return lambda: line_client(mqks_server.ports["mqks"])


@pytest.fixture
def packed_backlog(start_server, line_client) -> Callable[..., tuple[Server, tuple[str, ...]]]:
    """A server (``--pack-ready-after=100`` on ``storage``) whose queue ``q`` (bound
    to event ``e``) holds ``count`` confirmed messages ``m0``... with bodies
    ``body 0``...: past the threshold, so they are packed.  With its arguments,
    for a restart on the same files."""

    def start(storage: str, data_dir: Path, count: int) -> tuple[Server, tuple[str, ...]]:
        args = ("--protocol=mqks:tcp:0:interface=127.0.0.1", "--pack-ready-after=100",
                f"--storage={storage}", f"--data-dir={data_dir}")
        server = start_server(*args)
        producer = line_client(server.ports["mqks"])
        producer.send("r rebind --confirm q e")
        assert producer.read(1) == [b"r ok "]
        producer.send(*[f"m{n} publish e body {n}" for n in range(count)],
                      "s publish --confirm nobody x")
        assert producer.read(1) == [b"s ok "]
        return server, args

    return start


@pytest.fixture
def line_client() -> Iterator:
    """MQKS LineClients to any port, for servers started with several protocols."""
    clients: list[LineClient] = []

    def make(port: int) -> LineClient:
        client = LineClient(port)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def run_client() -> Iterator:
    """Run a script from contrib/clients/ to completion: (exit status, its output).

    Scripts run as users run them (a subprocess with argv), so what the docs
    tell users to type is what is tested."""
    clients = Path(__file__).resolve().parents[2] / "contrib" / "clients"
    started: list[subprocess.Popen] = []

    def run(command: str, script: str, *args: str, timeout: float = 60,
            wait: bool = True) -> tuple[int, str] | subprocess.Popen:
        process = subprocess.Popen(
            [command, str(clients / script), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        started.append(process)
        if not wait:
            return process
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
