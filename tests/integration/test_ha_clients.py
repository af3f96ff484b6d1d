"""Clients find the new active (issue 18 item 3), with real client programs.

Two ``--ha`` nodes on one PostgreSQL database, every protocol on a fixed
port per node (as on two machines); the clients are given both nodes'
addresses.  The active is killed with ``kill -9`` while they consume:

- the MQKS consumer (``contrib/clients/mqks_failover_consumer.py``) and the
  PHP one (``contrib/clients/phpmq_failover_consumer.php``) reconnect in a
  loop, consume again on the new active and get every message, the ones
  published after the takeover included;
- through HAProxy (``mqserver.crashtest.balancer``, configured as docs/ha.md
  says: a TCP frontend per protocol, ``GET /health`` == 200 as the check),
  a second MQKS consumer that knows only the balancer's address, and
  eventmq 0.3.13's own job manager and client: the job manager notices the
  missed heartbeats, reconnects to the same address, and the balancer sends
  it to the new active, which runs the next job.

eventmq's own "failover address" (``WORKER_ADDR_FAILOVER``) does not work in
0.3.13: the job manager toggles ``conf.WORKER_ADDR`` when the broker goes,
but reconnects to the address ``start()`` was given, forever; so its users
need the balancer (or a DNS name that moves), as docs/ha.md says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqserver.crashtest import http
from mqserver.crashtest.balancer import Balancer
from mqserver.crashtest.failover import Node
from mqserver.crashtest.server import Lines

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "contrib" / "clients"
EVENTMQ_VENV = Path(os.environ.get("EVENTMQ_VENV", ROOT / ".venv-eventmq"))
FAST = ("--ha-lease=2", "--ha-renew=0.5", "--ha-poll=0.2")


def wait_for(condition, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what or str(condition))
        time.sleep(0.05)


def publish(port: int, event: str, bodies: list[str]) -> None:
    """Confirmed publishes; each body is also its request id, which MQKS makes the message id."""
    lines = Lines(port)
    try:
        for body in bodies:
            lines.send(b"%s publish --confirm %s %s\n" % (body.encode(), event.encode(),
                                                          body.encode()))
            assert lines.expect(b"%s ok " % body.encode(), 10.0)
    finally:
        lines.close()


class Output:
    """A client subprocess with its stdout collected line by line."""

    def __init__(self, argv: list[str], tmp_path: Path, name: str) -> None:
        self.path = tmp_path / f"{name}.out"
        self.process = subprocess.Popen(argv, cwd=CLIENTS, stdout=self.path.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def got(self) -> set[str]:
        return {line[4:] for line in self.lines() if line.startswith("got ")}

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def balancer(two_nodes, tmp_path):
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (.ci/run installs Debian's haproxy)")
    balancer = Balancer(two_nodes, tmp_path)
    yield balancer
    balancer.stop()


@pytest.fixture
def two_nodes(tmp_path, postgres_dsn):
    args = ["--storage=postgres", f"--postgres-dsn={postgres_dsn}",
            f"--data-dir={tmp_path / 'data'}", *FAST]
    first = Node("a", args, tmp_path, fixed=True)
    nodes = [first]
    try:
        wait_for(lambda: first.health()[0] == 200, what="node a active")
        nodes.append(Node("b", args, tmp_path, fixed=True))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_mqks_and_php_consumers_reconnect_and_consume_again(two_nodes, balancer, tmp_path):
    a, b = two_nodes
    admin = http.Client(a.http)
    admin.call("PUT", "/api/queues/mq", {"bindings": ["mev"]})
    admin.call("PUT", "/api/queues/pq", {"bindings": ["pev"]})
    admin.call("PUT", "/api/queues/lq", {"bindings": ["lev"]})
    publish(a.fixed_ports["mqks"], "lev", [f"l{n}" for n in range(5)])
    publish(a.fixed_ports["mqks"], "mev", [f"m{n}" for n in range(5)])
    publish(a.fixed_ports["mqks"], "pev", [f"p{n}" for n in range(5)])
    address = "127.0.0.1:{}".format
    clients = {"mqks": Output(
        [sys.executable, "mqks_failover_consumer.py", "mq", "mev", "10",
         address(a.fixed_ports["mqks"]), address(b.fixed_ports["mqks"])], tmp_path, "mqks"),
               "balanced": Output(
        [sys.executable, "mqks_failover_consumer.py", "lq", "lev", "10",
         address(balancer.ports["mqks"])], tmp_path, "balanced")}
    if shutil.which("php"):
        clients["php"] = Output(
            ["php", "phpmq_failover_consumer.php", "pq", "10",
             address(a.fixed_ports["phpmq"]), address(b.fixed_ports["phpmq"])], tmp_path, "php")
    try:
        wait_for(lambda: all(len(c.got()) == 5 for c in clients.values()),
                 what="the first five messages")
        a.kill()
        wait_for(lambda: b.health()[0] == 200,
                 what="node b active: " + "".join(b.server.output[-30:]))
        publish(b.fixed_ports["mqks"], "mev", [f"m{n}" for n in range(5, 10)])
        publish(b.fixed_ports["mqks"], "lev", [f"l{n}" for n in range(5, 10)])
        publish(b.fixed_ports["mqks"], "pev", [f"p{n}" for n in range(5, 10)])
        for client in clients.values():
            client.process.wait(60)
    finally:
        for client in clients.values():
            client.stop()
    mqks = clients["mqks"]
    assert mqks.process.returncode == 0, mqks.lines()
    assert mqks.got() == {f"m{n}" for n in range(10)}
    assert f"reconnected to 127.0.0.1:{b.fixed_ports['mqks']}" in mqks.lines()
    balanced = clients["balanced"]
    assert balanced.process.returncode == 0, balanced.lines()
    assert balanced.got() == {f"l{n}" for n in range(10)}
    assert f"reconnected to 127.0.0.1:{balancer.ports['mqks']}" in balanced.lines()
    if "php" in clients:
        php = clients["php"]
        assert php.process.returncode == 0, php.lines()
        assert php.got() == {f"p{n}" for n in range(10)}
        assert f"reconnected to 127.0.0.1:{b.fixed_ports['phpmq']}" in php.lines()


EVENTMQ_CLIENT = '''
import json, sys
from eventmq.sender import Sender
from eventmq.client.messages import defer_job
s = Sender()
s.connect(sys.argv[1])
msgid = defer_job(s, "interop_jobs.add", args=(2, 3, sys.argv[2]), reply_requested=True)
replies = []
while len(replies) < 2 and s.zsocket.poll(int(sys.argv[3]) * 1000):
    replies.append(s.recv_multipart())
print(json.dumps({"msgid": msgid, "replies": replies}))
'''
JOBS = '''
def add(a, b, out):
    with open(out, "a") as f:
        f.write("%d\\n" % (a + b))
    return a + b
'''


@pytest.mark.skipif(not (EVENTMQ_VENV / ".installed").exists(),
                    reason=f"eventmq 0.3.13 is not installed in {EVENTMQ_VENV} "
                    "(`make .venv-eventmq/.installed`)")
def test_eventmq_job_manager_and_client_through_the_balancer(two_nodes, balancer, tmp_path):
    a, b = two_nodes
    (tmp_path / "interop_jobs.py").write_text(JOBS)
    (tmp_path / "client.py").write_text(EVENTMQ_CLIENT)
    (tmp_path / "eventmq.conf").write_text("")
    backend = f"tcp://127.0.0.1:{balancer.ports['emqp-backend']}"
    env = dict(os.environ, PYTHONPATH=str(tmp_path),
               EVENTMQ_CONFIG_FILE=str(tmp_path / "eventmq.conf"),
               EVENTMQ_WAL=str(tmp_path / "wal.log"), EVENTMQ_QUEUES='[[10, "default"]]',
               EVENTMQ_WORKER_ADDR=backend, EVENTMQ_WORKER_ADDR_DEFAULT=backend,
               EVENTMQ_WORKER_ADDR_FAILOVER=backend)
    log = (tmp_path / "jobmanager.log").open("w")
    manager = subprocess.Popen([str(EVENTMQ_VENV / "bin" / "emq-jobmanager"), "-B", backend,
                                "-J", "1"], cwd=tmp_path, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)

    def job(out: Path, wait: int) -> dict:
        done = subprocess.run(
            [str(EVENTMQ_VENV / "bin" / "python"), "client.py",
             f"tcp://127.0.0.1:{balancer.ports['emqp']}", str(out), str(wait)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=wait + 30)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        before = tmp_path / "before.txt"
        assert len(job(before, 20)["replies"]) == 2
        assert before.read_text() == "5\n"
        a.kill()
        wait_for(lambda: b.health()[0] == 200, what="node b active")
        # the request waits in the new active until the job manager, its
        # heartbeats unanswered, reconnects and the balancer sends it there
        after = tmp_path / "after.txt"
        answer = job(after, 45)
        assert [reply[2] for reply in answer["replies"]] == ["REPLY", "REPLY"], answer
        assert after.read_text() == "5\n"
    finally:
        if manager.poll() is None:
            os.killpg(manager.pid, signal.SIGKILL)
        manager.wait()
        log.close()
