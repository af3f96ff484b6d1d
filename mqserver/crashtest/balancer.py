"""HAProxy in front of ``--ha`` nodes, as docs/ha.md configures it, for tests.

One TCP frontend per protocol port on loopback; each backend lists every
node and checks it with ``GET /health`` on the node's HTTP port, expecting
200, so only the active gets connections; ``on-marked-down
shutdown-sessions`` cuts clients off a node the moment its check fails.
Debian's ``haproxy`` package (``.ci/run`` installs it); ``haproxy -db``
runs in the foreground and is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from mqserver.pgtesting import free_port

PROTOCOLS = ("mqks", "phpmq", "emqp", "emqp-backend")


def config(nodes: list[Any], frontends: dict[str, int], check_interval_ms: int = 200) -> str:
    """The haproxy.cfg: ``nodes`` have ``name``, ``http`` and ``fixed_ports``."""
    lines = [
        "global", "    maxconn 2000",
        "defaults", "    mode tcp", "    timeout connect 2s", "    timeout client 1h",
        "    timeout server 1h",
        f"    default-server inter {check_interval_ms}ms fall 1 rise 1 "
        "on-marked-down shutdown-sessions",
    ]
    for protocol, port in frontends.items():
        lines += [f"backend be_{protocol}", "    option httpchk GET /health",
                  "    http-check expect status 200"]
        lines += [f"    server {node.name} 127.0.0.1:{node.fixed_ports[protocol]} check "
                  f"port {node.http}" for node in nodes]
        lines += [f"frontend fe_{protocol}", f"    bind 127.0.0.1:{port}",
                  f"    default_backend be_{protocol}"]
    return "\n".join(lines) + "\n"


class Balancer:
    """``haproxy -db`` with a frontend per protocol; ``ports[protocol]`` is where clients go."""

    def __init__(self, nodes: list[Any], workdir: Path) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (.ci/run installs it)")
        self.ports = {protocol: free_port() for protocol in PROTOCOLS}
        self.path = workdir / "haproxy.cfg"
        self.path.write_text(config(nodes, self.ports))
        self.log = (workdir / "haproxy.log").open("w")
        self.process = subprocess.Popen([binary, "-db", "-f", str(self.path)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("haproxy did not start: "
                                   + (workdir / "haproxy.log").read_text())
            time.sleep(0.05)

    def _accepts(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.ports["mqks"]), 0.5):
            return True
        return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
