"""MQKS against the real server: twistd subprocess, raw TCP sockets."""

from __future__ import annotations

import re

import pytest

EID = re.compile(rb"^\S+ error \d{20}[0-9a-zA-Z]{4}$")


def test_hello_world_from_the_spec(connect):
    alice, bob, charlie, dave = connect(), connect(), connect(), connect()
    alice.send("Alice consume --confirm greetings hi hello")
    bob.send("Bob consume --confirm greetings hi hello")
    charlie.send("Charlie consume --confirm greetings-and-byes hi hello bye good-bye")
    assert alice.read(1) == [b"Alice ok "]
    assert bob.read(1) == [b"Bob ok "]
    assert charlie.read(1) == [b"Charlie ok "]
    dave.send("Dave publish hello world")
    assert charlie.read(1) == [b"Charlie ok Dave event=hello world"]
    alice_quiet, bob_quiet = alice.quiet(), bob.quiet()
    assert alice_quiet != bob_quiet, "exactly one of Alice and Bob gets it"
    got = alice.read(1) if not alice_quiet else bob.read(1)
    assert got in ([b"Alice ok Dave event=hello world"], [b"Bob ok Dave event=hello world"])
    assert dave.quiet()


def test_round_robin_manual_ack_and_disconnect_requeue(connect):
    a, b, p = connect(), connect(), connect()
    a.send("a consume --confirm q e --manual-ack")
    b.send("b consume --confirm q e --manual-ack")
    assert a.read(1) == [b"a ok "] and b.read(1) == [b"b ok "]
    p.send(*[f"m{n} publish e body {n}" for n in range(4)])
    assert a.read(2) == [b"a ok m0 event=e body 0", b"a ok m2 event=e body 2"]
    assert b.read(2) == [b"b ok m1 event=e body 1", b"b ok m3 event=e body 3"]
    p.send("x ack --confirm a m0")
    assert p.read(1) == [b"x ok "]
    a.close()
    assert b.read(1) == [b"b ok m2 event=e,retry=1 body 2"]
    b.send("r reject --confirm b m1")
    # with durable storage (the default) the confirm waits for the commit,
    # so the redelivery may overtake it
    assert sorted(b.read(2)) == [b"b ok m1 event=e,retry=1 body 1", b"r ok "]


def test_errors_keep_the_connection(connect, mqks_server):
    c = connect()
    c.send("short", "x nope data", "e _eval __import__('os').system('id')", "e2 _eval 1/0")
    lines = c.read(4)
    assert [line.split(b" ")[0] for line in lines] == [b"None", b"x", b"e", b"e2"]
    assert all(EID.match(line) for line in lines)
    c.send("p ping fine", "w _eval WORKERS", "q _eval len(state.queues)")
    assert c.read(3) == [b"p ok fine", b"w ok 1", b"q ok 0"]
    eid = lines[1].split(b" ")[2].decode()
    mqks_server.wait_for_log(eid)


def test_big_line_goes_through(connect):
    c = connect()
    body = "x" * (4 * 1024 * 1024)
    c.send("c consume --confirm q e")
    assert c.read(1) == [b"c ok "]
    c.send(f"m publish e {body}")
    assert c.read(1, timeout=30) == [f"c ok m event=e {body}".encode()]


def test_line_over_the_limit_is_refused_and_closed(start_server):
    from socket import create_connection

    server = start_server("--protocol=mqks:tcp:0:interface=127.0.0.1", "--mqks-max-line=1000")
    sock = create_connection(("127.0.0.1", server.ports["mqks"]), timeout=10)
    sock.sendall(b"p ping " + b"x" * 5000 + b"\n")
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    assert data.startswith(b"None error ") and data.endswith(b"\n")
    sock.close()
    other = create_connection(("127.0.0.1", server.ports["mqks"]), timeout=10)
    other.sendall(b"p ping alive\n")
    assert other.recv(100) == b"p ok alive\n"
    other.close()


def test_delete_queue_when_unused_timeout(connect):
    c = connect()
    c.send("c1 consume --confirm q1 e1 --delete-queue-when-unused=1")
    assert c.read(1) == [b"c1 ok "]
    c.send("d1 delete_consumer --confirm c1", "m1 publish --confirm e1 kept")
    assert c.read(2) == [b"d1 ok ", b"m1 ok "]
    c.send("c2 consume --confirm q1 e1 --delete-queue-when-unused=1")
    assert c.read(2) == [b"c2 ok ", b"c2 ok m1 event=e1 kept"]
    c.send("d2 delete_consumer --confirm c2")
    assert c.read(1) == [b"d2 ok "]
    # poll (with a deadline) until the server's 1 s timer has deleted the queue
    for _ in range(50):
        c.send("n _eval len(state.queues)")
        if c.read(1) == [b"n ok 0"]:
            break
        c.quiet(0.1)
    else:
        raise AssertionError("queue was not deleted after 1 s unused")


def test_clean_shutdown_logs_connections(mqks_server, connect):
    c = connect()
    c.send("p ping x")
    assert c.read(1) == [b"p ok x"]
    c.close()
    # Twisted shuts down cleanly on SIGTERM, then re-raises the signal
    assert mqks_server.stop() in (0, -15)
    text = mqks_server.text()
    assert "Server Shut Down." in text
    assert "mqks connection 1 opened from 127.0.0.1" in text
    assert "mqks connection 1 closed" in text


def test_a_pipelined_burst_is_refused_and_answered_in_line_order(connect):
    """Publishes in one write go to the broker as runs (issue 8): a full
    reject-publish queue refuses each in its place, among the other answers."""
    c = connect()
    c.send("c consume --confirm q e --max-length=3 --overflow=reject-publish",
           "d delete_consumer --confirm c")
    assert c.read(2) == [b"c ok ", b"d ok "]
    c.send(*[f"m{n} publish e body {n}" for n in range(5)], "p ping between",
           "m5 publish --confirm e body 5", "x publish")
    lines = c.read(5)
    assert [line.split(b" ")[0] for line in lines] == [b"m3", b"m4", b"p", b"m5", b"None"]
    assert lines[2] == b"p ok between"
    assert all(EID.match(line) for i, line in enumerate(lines) if i != 2)
    c.send("c2 consume q")
    assert c.read(3) == [b"c2 ok m%d event=e body %d" % (n, n) for n in range(3)]


@pytest.mark.parametrize("storage", ["memory", "sqlite", "log"])
def test_a_consume_confirm_comes_first_with_every_backend(start_server, line_client, storage):
    """The original answers ``ok `` before any delivery.  Here a durable store's
    confirm waits for its commit: a queue holding messages that its previous
    consumer just returned, and a publish in the same chunk as the consume
    (a store batch in flight), must still get the confirm first."""
    server = start_server(f"--storage={storage}", "--protocol=mqks:tcp:0:interface=127.0.0.1")
    port = server.ports["mqks"]
    old, publisher = line_client(port), line_client(port)
    old.send("a consume --confirm q e --manual-ack")
    assert old.read(1) == [b"a ok "]
    publisher.send(*[f"m{n} publish e body {n}" for n in range(20)])
    assert len(old.read(20)) == 20
    old.close()  # all twenty go back to q
    for attempt in range(3):
        new = line_client(port)
        new.send(f"x{attempt} publish e more", f"c{attempt} consume --confirm q e --manual-ack")
        lines = new.read(3)
        assert lines[0] == f"c{attempt} ok ".encode(), lines
        new.close()  # its unacked messages go back to q for the next attempt


@pytest.mark.parametrize("store", [("--storage=sqlite",), ("--storage=log", "--fsync=always")])
def test_pipelined_confirmed_publishes_are_answered_in_order_and_survive_kill_9(
        start_server, line_client, tmp_path, store):
    """A chunk's confirms wait for the store together (issue 19): each still
    gets its ``ok ``, in order, and only once what it published is on disk."""
    args = ("--protocol=mqks:tcp:0:interface=127.0.0.1", f"--data-dir={tmp_path / 'data'}",
            *store)
    server = start_server(*args)
    client = line_client(server.ports["mqks"])
    client.send("r rebind --confirm q e")
    assert client.read(1) == [b"r ok "]
    client.send(*[f"m{n} publish --confirm e body {n}" for n in range(1000)])
    assert client.read(1000, timeout=60) == [b"m%d ok " % n for n in range(1000)]
    server.process.kill()  # every publish was confirmed: all must be on disk
    server.process.wait()

    server = start_server(*args)
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume q e")
    assert consumer.read(1000, timeout=60) == [
        b"c ok m%d event=e body %d" % (n, n) for n in range(1000)]
    assert consumer.quiet()


def test_confirm_is_stripped_from_every_action(connect, mqks_server):
    c = connect()
    c.send("p1 ping --confirm hello", "e1 _eval --confirm 1+1",
           "w _eval ' '.join(config['workers'])")
    assert c.read(4) == [b"p1 ok hello", b"p1 ok ", b"e1 ok 2",
                         f"w ok 127.0.0.1:{mqks_server.ports['mqks']}:{mqks_server.ports['mqks']}"
                         .encode()]
