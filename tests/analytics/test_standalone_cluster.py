"""The CLI on a real standalone Spark master and worker from the installed pyspark.

Both are started with ``spark-class`` on 127.0.0.1 and stopped by PID; the
CLI runs as a subprocess (its own driver JVM) with ``--master spark://...``,
which it must use as given.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the analytics extra (pyspark) is not installed")
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
CLI = os.path.join(os.path.dirname(sys.executable), "mqserver-analytics")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A spark-class JVM whose log is collected; ``wait_for`` polls it with a deadline."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.log: list[str] = []
        self.process = subprocess.Popen([str(SPARK_CLASS), *args], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)

    def wait_for(self, text: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.log):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} in:\n" + "".join(self.log))
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Daemon, dict[str, str]]]:
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark needs a JRE (openjdk-17-jre-headless)")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "w"),
           "SPARK_HOME": str(SPARK_CLASS.parent.parent), "PYSPARK_PYTHON": sys.executable}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[Daemon] = []
    try:
        master = Daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(free_port())], env)
        daemons.append(master)
        master.wait_for("I have been elected leader")
        worker = Daemon(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                         url], env)
        daemons.append(worker)
        master.wait_for("Registering worker")
        yield url, master, env
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def test_cli_runs_on_a_standalone_cluster(cluster, tmp_path):
    url, master, env = cluster
    folder = tmp_path / "journal" / "date=2026-11-20"
    folder.mkdir(parents=True)
    records = [{"v": 1, "seq": n + 1, "node": "n", "ts": f"2026-11-20T10:00:0{n}.000001Z",
                "event": "published", "queue": "q", "protocol": "mqks", "message_id": f"m{n}",
                "publish_ts": f"2026-11-20T10:00:0{n}.000001Z", "delivery_count": 0,
                "size": 10} for n in range(5)]
    (folder / "seg-n-0000000000000001.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    result = subprocess.run(
        [CLI, "--master", url, "--journal", str(tmp_path / "journal"), "--out", str(out),
         "--reports", "throughput,seq_gaps"],
        env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert f"on {url}" in result.stderr  # the explicit master was used as given
    master.wait_for("Registering app mqserver-analytics", timeout=5)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["records"], summary["malformed_lines"]) == (5, 0)
    import pyarrow.parquet as pq

    table = pq.read_table(out / "throughput").to_pylist()
    assert [(r["queue"], r["event"], r["count"], r["bytes"]) for r in table] == [
        ("q", "published", 5, 50)]
