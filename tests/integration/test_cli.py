"""The ``mqserver`` console script: ``twistd -n mqserver`` under one name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import mqserver

MQSERVER = os.path.join(os.path.dirname(sys.executable), "mqserver")


def test_version(tmp_path):
    out = subprocess.run([MQSERVER, "--version"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=60)
    assert out.returncode == 0
    assert f"mqserver {mqserver.__version__}" in out.stdout


def test_runs_the_broker_in_the_foreground(tmp_path):
    process = subprocess.Popen(
        [MQSERVER, "--protocol=mqks:tcp:0:interface=127.0.0.1", "--storage=memory", "--no-http"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 30
        assert process.stdout is not None
        for line in process.stdout:  # poll the log with a deadline until it listens
            if "mqks listening on 127.0.0.1:" in line:
                port = int(line.rsplit(":", 1)[1])
                break
            assert time.monotonic() < deadline
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"p ping x\n")
            assert sock.recv(100) == b"p ok x\n"
    finally:
        process.terminate()
        process.wait(15)
    assert not (tmp_path / "twistd.pid").exists()
