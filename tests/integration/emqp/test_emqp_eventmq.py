"""Interop with eventmq 0.3.13 itself: its job manager, client library and schedules.

eventmq lives in its own venv (``make .venv-eventmq/.installed``, run by
``make test``) because its pins do not install on Python 3.11; see
docs/protocols/emqp.md.  Without it these tests skip and say why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EVENTMQ_VENV = Path(os.environ.get("EVENTMQ_VENV", ROOT / ".venv-eventmq"))
PYTHON = EVENTMQ_VENV / "bin" / "python"
JOBMANAGER = EVENTMQ_VENV / "bin" / "emq-jobmanager"

pytestmark = pytest.mark.skipif(
    not (JOBMANAGER.exists() and (EVENTMQ_VENV / ".installed").exists()),
    reason=f"eventmq 0.3.13 is not installed in {EVENTMQ_VENV} "
    "(`make .venv-eventmq/.installed` makes it; `make test` runs that first)",
)

JOBS = '''
def add(a, b, out):
    with open(out, "a") as f:
        f.write("%d\\n" % (a + b))
    return a + b
'''

CLIENT = '''
import json, sys, time
from eventmq.sender import Sender
from eventmq.client.messages import defer_job, schedule
address, action, out = sys.argv[1], sys.argv[2], sys.argv[3]
s = Sender()
s.connect(address)
def recv():
    if not s.zsocket.poll(10000):
        raise SystemExit("no answer from the broker")
    return s.recv_multipart()
if action == "defer":
    msgid = defer_job(s, "interop_jobs.add", args=(2, 3, out), reply_requested=True)
    print(json.dumps({"msgid": msgid, "accepted": recv(), "result": recv()}))
else:
    msgid = schedule(s, "interop_jobs.add", interval_secs=1, args=(1, 1, out),
                     unschedule=action == "unschedule")
    print(json.dumps({"msgid": msgid, "ack": recv()}))
'''


@pytest.fixture
def eventmq_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "interop_jobs.py").write_text(JOBS)
    (tmp_path / "client.py").write_text(CLIENT)
    (tmp_path / "eventmq.conf").write_text("")
    return dict(
        os.environ,
        PYTHONPATH=str(tmp_path),
        EVENTMQ_CONFIG_FILE=str(tmp_path / "eventmq.conf"),
        EVENTMQ_WAL=str(tmp_path / "wal.log"),
        EVENTMQ_QUEUES='[[10, "default"]]',
    )


@pytest.fixture
def jobmanager(tmp_path: Path, eventmq_env: dict[str, str]):
    """Start ``emq-jobmanager -J 1`` against a backend port; stopped by its process group."""
    started: list[subprocess.Popen] = []

    def start(backend_port: int) -> subprocess.Popen:
        address = f"tcp://127.0.0.1:{backend_port}"
        env = dict(eventmq_env, EVENTMQ_WORKER_ADDR=address, EVENTMQ_WORKER_ADDR_DEFAULT=address,
                   EVENTMQ_WORKER_ADDR_FAILOVER=address)
        with open(tmp_path / "jobmanager.log", "w") as log:
            process = subprocess.Popen(
                [str(JOBMANAGER), "-B", address, "-J", "1"], cwd=tmp_path, env=env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def client(tmp_path: Path, env: dict[str, str], port: int, action: str, out: Path) -> dict:
    result = subprocess.run(
        [str(PYTHON), str(tmp_path / "client.py"), f"tcp://127.0.0.1:{port}", action, str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def wait_for_worker(dealers, server, wait_for) -> None:
    admin = dealers(server.ports["emqp-admin"])
    wait_for(lambda: admin.admin(b"ROUTER_SHOW_WORKERS")["connected_workers"], timeout=20,
             what="eventmq's job manager to INFORM")


def test_jobmanager_runs_a_job_sent_by_eventmqs_client(
    start_emqp, dealers, jobmanager, eventmq_env, tmp_path, wait_for
):
    server = start_emqp("--storage=memory")
    jobmanager(server.ports["emqp-backend"])
    wait_for_worker(dealers, server, wait_for)
    out = tmp_path / "out.txt"
    answer = client(tmp_path, eventmq_env, server.ports["emqp"], "defer", out)
    assert answer["accepted"][2] == "REPLY" and answer["accepted"][4] == answer["msgid"]
    assert answer["result"][2] == "REPLY"
    assert answer["result"][4:] == ['{"value": 5}', answer["msgid"]]
    assert out.read_text() == "5\n"


def test_a_schedule_from_eventmqs_client_runs_on_time(
    start_emqp, dealers, jobmanager, eventmq_env, tmp_path, wait_for
):
    server = start_emqp("--storage=memory")
    jobmanager(server.ports["emqp-backend"])
    wait_for_worker(dealers, server, wait_for)
    out = tmp_path / "scheduled.txt"
    answer = client(tmp_path, eventmq_env, server.ports["emqp"], "schedule", out)
    assert answer["ack"][2] == "ACK" and answer["ack"][4] == answer["msgid"]
    # at once (no nohaste), then every second
    wait_for(lambda: out.exists() and out.read_text().count("2\n") >= 3, timeout=10,
             what="three runs of the scheduled job")
    client(tmp_path, eventmq_env, server.ports["emqp"], "unschedule", out)
    admin = dealers(server.ports["emqp-admin"])
    assert admin.admin(b"ROUTER_SHOW_SCHEDULERS")["scheduled_jobs"] == {}
