"""eMQP against the real server: twistd subprocess, stock pyzmq DEALERs as every peer."""

from __future__ import annotations

import json
import socket
import time

import zmq

V = b"eMQP/1.0"
RUN = json.dumps(["run", {"callable": "add", "path": "jobs", "args": [2, 3], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}]).encode()
FAST = ("--emqp-heartbeat=0.3", "--emqp-peer-timeout=2")


def test_client_worker_and_admin_round_trip(start_emqp, dealers):
    server = start_emqp("--storage=memory")
    client = dealers(server.ports["emqp"])  # no identity: the server assigns a binary one
    rid = client.send(b"REQUEST", b"default", b"reply-requested", RUN)
    accepted = client.recv()
    assert accepted[:3] == [b"", V, b"REPLY"] and accepted[4:] == [rid]
    worker = dealers(server.ports["emqp-backend"], b"worker-1")
    worker.inform(b'[[10, "default"], [5, "email"]]')
    assert worker.quiet(0.3)
    worker.send(b"READY")
    request = worker.recv()
    assert request == [b"", V, b"REQUEST", rid, b"default", b"reply-requested", RUN]
    worker.send(b"REPLY", b'{"value": 5}', rid)
    result = client.recv()
    assert result[2] == b"REPLY" and result[4:] == [b'{"value": 5}', rid]
    admin = dealers(server.ports["emqp-admin"])
    workers = admin.admin(b"ROUTER_SHOW_WORKERS")
    assert workers["connected_queues"] == {"default": [[10, "worker-1"]], "email": [[5, "worker-1"]]}
    status = admin.admin(b"STATUS")
    assert status["processed_messages_by_worker"] == {"worker-1": 1}


def test_priority_and_heartbeats_and_a_dead_worker_rerouted(start_emqp, dealers, wait_for):
    server = start_emqp("--storage=memory", *FAST)
    high = dealers(server.ports["emqp-backend"], b"high")
    low = dealers(server.ports["emqp-backend"], b"low")
    high.inform(b'[[20, "jobs"]]')
    low.inform(b'[[1, "jobs"]]')
    high.send(b"READY")
    low.send(b"READY")
    client = dealers(server.ports["emqp"], b"client")
    rid = client.send(b"REQUEST", b"jobs", b"guarantee", RUN)
    got = high.recv()
    assert got[3] == rid and got[5] == b"guarantee,reply-requested"
    assert high.recv(skip=())[2] == b"HEARTBEAT"
    high.close()  # dies without KBYE: its guaranteed job goes to the next worker
    rerouted = _recv_alive(low, 10)
    assert rerouted[3] == rid
    low.send(b"REPLY", b'{"value": 1}', rid)
    admin = dealers(server.ports["emqp-admin"])
    wait_for(lambda: list(admin.admin(b"ROUTER_SHOW_WORKERS")["connected_workers"]) == ["low"],
             what="the silent worker to be dropped")
    server.wait_for_log("removed (silent for")


def _recv_alive(worker, timeout: float) -> list[bytes]:
    """Receive while heartbeating, as a live worker does (any message is liveness)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.send(b"HEARTBEAT", b"0")
        try:
            return worker.recv(timeout=0.2)
        except TimeoutError:
            continue
    raise TimeoutError("no request within the deadline")


def test_schedule_runs_in_the_broker_and_unschedule_stops_it(start_emqp, dealers):
    server = start_emqp("--storage=memory")
    worker = dealers(server.ports["emqp-backend"], b"w")
    worker.inform()
    for _ in range(10):
        worker.send(b"READY")
    client = dealers(server.ports["emqp"], b"c")
    sid = client.send(b"SCHEDULE", b"default", b"", b"1", RUN, b"")
    assert client.recv()[4] == sid
    runs = [worker.recv(timeout=5) for _ in range(3)]
    assert all(r[2] == b"REQUEST" and r[6] == RUN for r in runs)
    client.send(b"UNSCHEDULE", b"default", b"", b"1", RUN, b"")
    assert client.recv()[2] == b"ACK"
    late = 0  # a run may have been on its way when UNSCHEDULE arrived
    while not _quiet_for(worker, 1.5):
        late += 1
        assert late <= 2, "the schedule kept running after UNSCHEDULE"


def _quiet_for(worker, seconds: float) -> bool:
    try:
        worker.recv(timeout=seconds)
    except TimeoutError:
        return True
    return False


def test_requests_and_schedules_survive_a_restart(start_emqp, dealers, tmp_path):
    args = ("--storage=sqlite", f"--data-dir={tmp_path / 'data'}")
    server = start_emqp(*args)
    client = dealers(server.ports["emqp"], b"c")
    rid = client.send(b"REQUEST", b"default", b"", RUN)
    assert client.recv()[4] == rid
    client.send(b"SCHEDULE", b"default", b"nohaste", b"3600", RUN, b"")
    assert client.recv()[2] == b"ACK"
    assert server.stop() in (0, -15)
    again = start_emqp(*args)
    worker = dealers(again.ports["emqp-backend"], b"w")
    worker.inform()
    worker.send(b"READY")
    assert worker.recv()[3] == rid
    admin = dealers(again.ports["emqp-admin"])
    assert len(admin.admin(b"ROUTER_SHOW_SCHEDULERS")["scheduled_jobs"]) == 1


def test_publish_and_requests_cross_to_and_from_mqks(start_emqp, dealers, line_client, wait_for):
    server = start_emqp("--storage=memory", "--protocol=mqks:tcp:0:interface=127.0.0.1")
    wait_for(lambda: "mqks" in server.ports, what="mqks listener")
    mqks = line_client(server.ports["mqks"])
    mqks.send("c1 consume --confirm sports news.sports")
    assert mqks.read(1) == [b"c1 ok "]
    client = dealers(server.ports["emqp"], b"pub")
    client.send(b"PUBLISH", b"news.sports", b'{"goal": 1}', msgid=b"p1")
    assert mqks.read(1) == [b'c1 ok p1 event=news.sports {"goal": 1}']
    worker = dealers(server.ports["emqp-backend"], b"w")
    worker.inform(b'[[10, "jobs"]]')
    worker.send(b"READY")
    mqks.send("r rebind --confirm jobs --add job.created")
    assert mqks.read(1) == [b"r ok "]
    mqks.send("m1 publish --confirm job.created hello")
    assert mqks.read(1) == [b"m1 ok "]
    assert worker.recv() == [b"", V, b"REQUEST", b"m1", b"jobs", b"", b"hello"]


def test_garbage_binary_identities_and_wrong_sockets_do_not_hurt(
    start_emqp, dealers, zmq_context, wait_for
):
    server = start_emqp("--storage=memory")
    port = server.ports["emqp"]
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\x00" * 100)
    raw.settimeout(5)
    assert raw.recv(100)[:1] == b"\xff"  # our greeting, then we close
    raw.close()
    pub = zmq_context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    odd = dealers(port, b"\xff\xfe\x80odd")
    odd.socket.send_multipart([b"x"])
    odd.socket.send_multipart([b"", V, b"REQUEST", b"m", b"q", b"timeout:zz", b"{}"])
    odd.send(b"NOSUCH")
    rid = odd.send(b"REQUEST", b"default", b"", b"\xff\x00 binary body")
    assert odd.recv()[4] == rid
    backend = dealers(server.ports["emqp-backend"], b"\x80\x81")
    backend.inform()
    backend.send(b"READY")
    assert backend.recv()[3:] == [rid, b"default", b"", b"\xff\x00 binary body"]
    wait_for(lambda: "invalid socket type PUB" in server.text(), what="the PUB refusal")
    pub.close(0)
    admin = dealers(server.ports["emqp-admin"])
    assert "0x8081" in admin.admin(b"ROUTER_SHOW_WORKERS")["connected_workers"]


def test_disconnect_sends_kbye_and_stops_the_server(start_emqp, dealers):
    server = start_emqp("--storage=memory")
    worker = dealers(server.ports["emqp-backend"], b"w")
    worker.inform()
    scheduler = dealers(server.ports["emqp"], b"s")
    scheduler.inform(b"", b"scheduler")
    admin = dealers(server.ports["emqp-admin"])
    msgid = admin.send(b"DISCONNECT")
    ack = admin.recv()
    assert ack[2] == b"ACK" and ack[4] == msgid
    assert worker.recv()[2] == b"KBYE"
    assert scheduler.recv()[2] == b"KBYE"
    server.process.wait(15)
    assert server.process.returncode == 0
    assert "every peer was sent KBYE" in server.text()
