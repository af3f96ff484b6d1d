"""One SparkSession for every analytics test, and the real server writing a journal.

Spark needs Java and the ``analytics`` extra; without them these tests skip
and say which is missing.  The session uses the fast local settings of
``mqserver.analytics.session`` (about 5 s to start, once).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
LISTENING = re.compile(r"(\w+) listening on [\d.]+:(\d+)")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the analytics extra (pyspark) is not installed")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark needs a JRE (openjdk-17-jre-headless)")
    from mqserver.analytics.session import build_session

    session, created = build_session("local[2]", progress=False)
    yield session
    if created:
        session.stop()


@pytest.fixture
def journaled_server(tmp_path: Path) -> Iterator[Callable[..., dict[str, int]]]:
    """``start(journal, *protocols, args=())``: ``twistd -n mqserver
    --journal=journal`` (node ``e2e``, memory store, more ``args``) listening
    on 127.0.0.1 with ephemeral ports, one per protocol (``http`` included);
    returns the ports by protocol.  The
    server gets SIGTERM at the end of the test, or when ``stop()`` is called,
    which seals the journal."""
    processes: list[subprocess.Popen] = []

    def start(journal: Path, *protocols: str, args: tuple[str, ...] = ()) -> dict[str, int]:
        args = (*args, *(f"--protocol={p}:tcp:0:interface=127.0.0.1"
                         for p in protocols if p != "http"),
                "--http=tcp:0:interface=127.0.0.1" if "http" in protocols else "--no-http")
        process = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "mqserver", "--no-gc-tuning", "--storage=memory",
             *args, f"--journal={journal}", "--journal-node=e2e"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        processes.append(process)
        ports: dict[str, int] = {}
        assert process.stdout is not None
        for line in process.stdout:
            match = LISTENING.search(line)
            if match:
                ports[match.group(1)] = int(match.group(2))
            if len(ports) == len(protocols):
                return ports
        raise RuntimeError("server did not start")

    def stop() -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)

    start.stop = stop  # type: ignore[attr-defined]
    yield start
    stop()
