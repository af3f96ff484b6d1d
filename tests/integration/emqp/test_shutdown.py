"""SIGTERM: stop accepting, flush, KBYE to eMQP peers, close; a restart finds everything."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

TOKEN = "shutdown-token"


def http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

STORES = {
    "sqlite": ("--storage=sqlite",),
    "log": ("--storage=log", "--fsync=always"),
}


@pytest.mark.parametrize("storage", sorted(STORES))
def test_sigterm_says_kbye_keeps_what_was_confirmed_and_forgets_what_was_acked(
    start_emqp, dealers, line_client, wait_for, tmp_path, storage
):
    args = (*STORES[storage], f"--data-dir={tmp_path / 'data'}",
            "--protocol=mqks:tcp:0:interface=127.0.0.1",
            "--http=tcp:0:interface=127.0.0.1", f"--http-token={TOKEN}")
    server = start_emqp(*args)
    wait_for(lambda: {"mqks", "http"} <= set(server.ports), what="mqks and http listeners")
    web = server.ports["http"]
    assert http(web, "PUT", "/api/queues/h")[0] in (200, 201)
    assert http(web, "POST", "/api/queues/h/messages", {"body": "held", "durable": True})[0] == 201
    status, taken = http(web, "POST", "/api/queues/h/consume", {"consumer": "hc", "max": 1})
    assert status == 200 and [m["body"] for m in taken["messages"]] == ["held"]
    polls: list[tuple[int, dict]] = []
    poller = threading.Thread(target=lambda: polls.append(http(
        web, "POST", "/api/queues/h/consume", {"consumer": "hc", "max": 1, "timeout": 30})))
    poller.start()

    def polling() -> bool:
        [connection] = http(web, "GET", "/api/connections?protocol=http")[1]["connections"]
        return connection["consumers"][0]["credit"] == 1  # only while a poll waits

    wait_for(polling, what="the long poll")
    worker = dealers(server.ports["emqp-backend"], b"w")
    worker.inform(b'[[10, "jobs"]]')
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e --manual-ack")
    assert consumer.read(1) == [b"c ok "]
    producer = line_client(server.ports["mqks"])
    producer.send(*(f"m{n} publish --confirm e body {n}" for n in range(10)))
    assert producer.read(10) == [b"m%d ok " % n for n in range(10)]
    deliveries = consumer.read(10)
    assert deliveries == [b"c ok m%d event=e body %d" % (n, n) for n in range(10)]
    consumer.send(*(f"a{n} ack --confirm c m{n}" for n in range(5)))
    assert consumer.read(5) == [b"a%d ok " % n for n in range(5)]

    # m5..m9 are unacked in the consumer's hands, the worker is idle
    assert server.stop() in (0, 143, -15)
    assert worker.recv()[2] == b"KBYE"
    assert consumer.closed() and producer.closed()
    poller.join(10)  # the long poll was answered at the close, not after its 30 s
    assert not poller.is_alive() and polls and polls[0][0] == 200
    log = server.text()
    assert "Traceback" not in log
    assert "Main loop terminated." in log
    assert "stopped: store closed with 6 messages ready" in log  # m5..m9 and "held"

    again = start_emqp(*args)
    wait_for(lambda: "mqks" in again.ports, what="mqks listener")
    late = line_client(again.ports["mqks"])
    late.send("c2 consume --confirm q --manual-ack")
    # delivered once before the stop: the requeue at close counted it, and stored that
    assert late.read(6) == [
        b"c2 ok ", *(b"c2 ok m%d event=e,retry=1 body %d" % (n, n) for n in range(5, 10))
    ]
    assert late.quiet()
    # the HTTP consumer's unacked message went back to its queue, counted
    held = line_client(again.ports["mqks"])
    held.send("h2 consume --confirm h --manual-ack")
    [ok, line] = held.read(2)
    assert ok == b"h2 ok " and line.startswith(b"h2 ok ") and line.endswith(b",retry=1 held")
