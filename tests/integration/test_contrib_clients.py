"""The example clients in contrib/clients/ against a real ``twistd -n mqserver``.

The docs point users at these scripts; running them here is what keeps them
from rotting when a protocol or the HTTP API changes.
"""

from __future__ import annotations

import shutil
import sys

import pytest

PYTHON = sys.executable
LOOPBACK = "tcp:0:interface=127.0.0.1"


def test_mqks_client(start_server, run_client):
    server = start_server("--storage=memory", f"--protocol=mqks:{LOOPBACK}")
    status, output = run_client(PYTHON, "mqks_client.py", "127.0.0.1", str(server.ports["mqks"]))
    assert (status, output.splitlines()[-1]) == (0, "done"), output
    assert "ok delivery" in output


@pytest.mark.skipif(shutil.which("php") is None,
                    reason="php is not installed (.ci/run installs php-cli)")
def test_phpmq_client(start_server, run_client):
    server = start_server("--storage=memory", f"--protocol=phpmq:{LOOPBACK}")
    status, output = run_client("php", "phpmq_client.php", "127.0.0.1",
                                str(server.ports["phpmq"]))
    assert (status, output.splitlines()[-1]) == (0, "done"), output
    assert "ok dispatch of 'second job'" in output


def test_emqp_client_and_worker(start_server, run_client):
    server = start_server("--storage=memory", f"--protocol=emqp:{LOOPBACK}",
                          f"--emqp-backend={LOOPBACK}", f"--emqp-admin={LOOPBACK}")
    server.wait_for_log("emqp-backend listening on")  # the fixture waits for --protocol only
    worker = run_client(PYTHON, "emqp_worker.py", "127.0.0.1",
                        str(server.ports["emqp-backend"]), "--jobs", "1", wait=False)
    status, output = run_client(PYTHON, "emqp_client.py", "127.0.0.1",
                                str(server.ports["emqp"]))
    assert (status, output.splitlines()[-1]) == (0, "done"), output
    assert "ok result 5" in output
    worker_output, _ = worker.communicate(timeout=30)
    assert (worker.returncode, worker_output.splitlines()[-1]) == (0, "done"), worker_output


def test_http_client(start_server, run_client):
    server = start_server("--storage=memory", f"--protocol=mqks:{LOOPBACK}",
                          f"--http={LOOPBACK}", "--http-token=example-token")
    base = f"http://127.0.0.1:{server.ports['http']}"
    status, output = run_client(PYTHON, "http_client.py", base, "--token", "example-token")
    assert (status, output.splitlines()[-1]) == (0, "done"), output
    status, output = run_client(PYTHON, "http_client.py", base)
    assert status == 1 and "401" in output
