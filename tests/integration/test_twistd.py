"""The twistd command line: help, bad options, default protocols."""

from __future__ import annotations

import os
import subprocess
import sys

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([TWISTD, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_help_lists_every_option(tmp_path):
    out = run("mqserver", "--help", cwd=tmp_path)
    assert out.returncode == 0
    for text in ("--protocol", "--storage", "--data-dir", "--mqks-max-line", "mqks", "memory"):
        assert text in out.stdout


def test_unknown_protocol_fails_with_the_list(tmp_path):
    out = run("-n", "mqserver", "--protocol=carrier-pigeon", cwd=tmp_path)
    assert out.returncode != 0
    assert "unknown protocol 'carrier-pigeon'; available: " in out.stdout + out.stderr


def test_port_in_use_stops_the_server(start_server, tmp_path):
    first = start_server("--protocol=mqks:tcp:0:interface=127.0.0.1")
    port = first.ports["mqks"]
    out = subprocess.run(
        # memory: the first server holds the SQLite lock of this directory
        [TWISTD, "-n", "--pidfile=", "mqserver", f"--protocol=mqks:tcp:{port}:interface=127.0.0.1",
         "--storage=memory"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert "mqks could not listen" in out.stdout + out.stderr
    assert out.returncode == 1
