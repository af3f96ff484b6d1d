"""eMQP under overload with stock pyzmq peers: a worker that stops reading, a full queue."""

from __future__ import annotations

import json
import urllib.request

import zmq

V = b"eMQP/1.0"
LISTEN = "tcp:0:interface=127.0.0.1"
PAYLOAD = b"p" * (64 * 1024)
COUNT = 800  # 50 MiB of requests


def queue_view(port: int, name: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/queues/{name}", timeout=10) as r:
        return json.loads(r.read())


def test_a_worker_that_stops_reading_is_handed_no_more(start_emqp, dealers, wait_for):
    server = start_emqp("--storage=memory", f"--http={LISTEN}", "--emqp-peer-timeout=600")
    http = server.ports["http"]
    worker = dealers(server.ports["emqp-backend"], b"slow")
    worker.socket.setsockopt(zmq.RCVHWM, 1)  # takes effect for the pipe made at connect
    worker.inform(b'[[10, "jobs"]]')
    for _ in range(COUNT):
        worker.send(b"READY")  # credit for everything: only backpressure can stop it
    wait_for(lambda: queue_view(http, "jobs")["consumers"] == 1, what="the worker's consumer")
    client = dealers(server.ports["emqp"])
    for n in range(COUNT):
        client.send(b"REQUEST", b"jobs", b"", b"%06d" % n + PAYLOAD, msgid=b"r%d" % n)
    wait_for(lambda: (lambda v: v["depth"] + v["counters"]["delivered"])(queue_view(http, "jobs"))
             == COUNT, timeout=120, what="every request to be stored")
    view = queue_view(http, "jobs")
    # in the worker's libzmq pipe, both kernels' buffers and our transport buffer; the
    # rest waits in the queue
    assert view["counters"]["delivered"] * len(PAYLOAD) <= 16 * 1024 * 1024, view["counters"]
    assert view["depth"] > 0
    got = []
    while len(got) < COUNT:
        frames = worker.recv(timeout=60)
        if frames[2] == b"REQUEST":
            got.append(frames[3])
    assert got == [b"r%d" % n for n in range(COUNT)]
    print(f"emqp: {COUNT} x {len(PAYLOAD)} B requests, {view['counters']['delivered']} handed "
          f"to the worker that did not read, {view['depth']} kept in the queue")


def test_a_request_to_a_full_queue_gets_error(start_emqp, dealers):
    server = start_emqp("--storage=memory", "--max-queue-length=1", "--overflow=reject-publish")
    client = dealers(server.ports["emqp"])
    first = client.send(b"REQUEST", b"default", b"", b"job")
    assert client.recv()[4:] == [first]
    second = client.send(b"REQUEST", b"default", b"", b"job")
    error = client.recv()
    assert error[2] == b"ERROR" and error[4:6] == [second, b"QueueFull"]
