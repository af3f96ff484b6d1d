"""Pipelined REQUESTs on a durable store: every accept, then a kill -9 loses none of them.

A client that sends many REQUESTs without waiting has them read in a few
chunks; the frontend stores each chunk's run with one durability wait and
answers it in one write (tests/unit/test_emqp_protocol.py checks the wait
and the write).  Here the real server and a stock pyzmq DEALER check the
promise end to end: a ``REPLY`` only for what is on disk.
"""

from __future__ import annotations

import uuid

import pytest

V = b"eMQP/1.0"
COUNT = 1000
DURABLE = {
    "log-always": ("--storage=log", "--fsync=always"),
    "sqlite": ("--storage=sqlite",),
}


@pytest.mark.parametrize("name", sorted(DURABLE))
def test_pipelined_requests_are_all_accepted_and_survive_kill_9(
    name, start_emqp, dealers, tmp_path
):
    args = (*DURABLE[name], f"--data-dir={tmp_path / 'data'}")
    server = start_emqp(*args)
    client = dealers(server.ports["emqp"], b"client")
    msgids = [str(uuid.uuid4()).encode() for _ in range(COUNT)]
    for n, msgid in enumerate(msgids):  # all sent before any answer is read
        client.socket.send_multipart([b"", V, b"REQUEST", msgid, b"default", b"", b"job %d" % n])
    accepted = [client.recv() for _ in range(COUNT)]
    assert all(frames[:3] == [b"", V, b"REPLY"] for frames in accepted)
    assert [frames[4] for frames in accepted] == msgids  # every one, in request order

    server.process.kill()  # kill -9: only what was on disk before each REPLY is left
    server.process.wait()
    again = start_emqp(*args)
    worker = dealers(again.ports["emqp-backend"], b"worker")
    worker.inform(b'[[10, "default"]]')
    for _ in range(COUNT):
        worker.send(b"READY")
    requests = [worker.recv() for _ in range(COUNT)]
    assert [(r[3], r[6]) for r in requests] == [(m, b"job %d" % n) for n, m in enumerate(msgids)]
    assert worker.quiet(0.3)
