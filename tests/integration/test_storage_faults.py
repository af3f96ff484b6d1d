"""A real storage fault: the server's file-size limit is dropped to one byte under load.

``RLIMIT_FSIZE`` set from outside (``prlimit``) makes every write past the
first byte of any file fail with ``EFBIG`` (Python ignores ``SIGXFSZ``), as
a full disk would, without root or a tiny filesystem.  Raising it again is
the operator freeing space.
"""

from __future__ import annotations

import json
import resource
import time
import urllib.error
import urllib.request

import pytest
import zmq

TOKEN = "fault-token"
STORES = {
    "sqlite": ("--storage=sqlite",),
    "log": ("--storage=log", "--fsync=always"),
}


def http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def until(condition, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def set_file_limit(pid: int, limit: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


@pytest.mark.parametrize("storage", sorted(STORES))
def test_a_full_disk_confirms_nothing_and_the_server_keeps_serving(
    start_server, line_client, tmp_path, storage
):
    listen = "tcp:0:interface=127.0.0.1"
    args = (*STORES[storage], f"--data-dir={tmp_path / 'data'}", f"--http-token={TOKEN}",
            f"--protocol=mqks:{listen}", f"--http={listen}", f"--protocol=emqp:{listen}",
            f"--emqp-backend={listen}", f"--emqp-admin={listen}")
    server = start_server(*args)
    until(lambda: {"emqp-backend", "emqp-admin"} <= set(server.ports), "eMQP listeners")
    mqks, web = server.ports["mqks"], server.ports["http"]
    context = zmq.Context()
    emqp = context.socket(zmq.DEALER)
    emqp.setsockopt(zmq.LINGER, 0)
    emqp.connect(f"tcp://127.0.0.1:{server.ports['emqp']}")
    client = line_client(mqks)
    client.send("rb rebind --confirm q e", "m0 publish --confirm e before")
    assert client.read(2) == [b"rb ok ", b"m0 ok "]
    watcher = line_client(mqks)
    watcher.send("w consume --confirm live e")
    assert watcher.read(1) == [b"w ok "]

    set_file_limit(server.process.pid, 1)
    client.send("m1 publish --confirm e during")
    [answer] = client.read(1)
    assert answer.startswith(b"m1 error ")
    until(lambda: "nothing is confirmed until a batch succeeds" in server.text(), "the log")
    status, body = http(web, "POST", "/api/queues/q/messages", {"body": "over http", "durable": True})
    assert status == 503 and "storage failed" in body["error"]
    status, health = http(web, "GET", "/health")
    assert status == 503 and health["storage"]["ok"] is False
    assert health["storage"]["last_error"] and health["storage"]["pending_ops"] > 0
    # eMQP answers a REQUEST only once it is stored: no answer now
    emqp.send_multipart([b"", b"eMQP/1.0", b"REQUEST", b"r1", b"default", b"", b"job"])
    until(lambda: "storing a request failed; no answer sent" in server.text(), "the eMQP log")
    assert not emqp.poll(200)
    emqp.close(0)
    context.term()
    status, metrics = http(web, "GET", "/metrics")
    assert "mqserver_storage_ok 0.0" in metrics
    # memory keeps serving: what was published is delivered all the same
    assert watcher.read(1) == [b"w ok m1 event=e during"]

    set_file_limit(server.process.pid, resource.RLIM_INFINITY)
    if storage == "sqlite":
        # the writer's retry goes through on its own: no restart, no hole
        until(lambda: http(web, "GET", "/health")[0] == 200, "storage to heal")
        client.send("m2 publish --confirm e after")
        assert client.read(1) == [b"m2 ok "]
        # m1 and the HTTP message were refused a confirm, yet stored by the retry
        expected = [b" before", b" during", b" over http", b" after"]
    else:
        # the log store stops writing at its first failure (its index may be
        # ahead of its files) and stays failed until a restart recovers it
        client.send("m2 publish --confirm e after")
        assert client.read(1)[0].startswith(b"m2 error ")
        expected = [b" before"]
    server.stop()

    again = start_server(*args)
    consumer = line_client(again.ports["mqks"])
    consumer.send("c consume --confirm q")
    got = consumer.read(1 + len(expected))[1:]
    assert [next(e for e in expected if line.endswith(e)) for line in got] == expected
    assert consumer.quiet()
