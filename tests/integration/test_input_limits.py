"""The input limits as ``twistd mqserver`` options, against the real server.

The unit tests (tests/unit/test_limits.py) cover every rule; this checks that
``--max-name-bytes``, ``--max-id-bytes``, ``--max-names-per-request`` and
``--emqp-max-frames`` reach the protocols of a running server, over real sockets.
"""

from __future__ import annotations

import json
import re
import socket
import uuid

import zmq

from mqserver.protocols.phpmq import codec as phpmq
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.decoder import MessageDecoder

LISTEN = "tcp:0:interface=127.0.0.1"
EID = re.compile(rb"^c2 error \d{20}[0-9a-zA-Z]{4}$")


def _closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (fails on a timeout)."""
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_name_and_id_limits_reach_mqks_and_phpmq(start_server, line_client):
    server = start_server(f"--protocol=mqks:{LISTEN}", f"--protocol=phpmq:{LISTEN}",
                          "--storage=memory", "--max-name-bytes=8", "--max-id-bytes=6")
    mqks = line_client(server.ports["mqks"])
    mqks.send("c1 consume --confirm q1234567", "c2 consume --confirm q12345678",
              "r1234567 ping x", "p ping alive")
    replies = mqks.read(4)
    assert replies[0] == b"c1 ok "
    assert EID.match(replies[1])
    assert replies[2].startswith(b"None error ")
    assert replies[3] == b"p ok alive"
    server.wait_for_log("name of 9 bytes; at most 8 are allowed")  # the eid's log line

    sock = socket.create_connection(("127.0.0.1", server.ports["phpmq"]), timeout=10)
    sock.sendall(phpmq.publish(b"q12345678", b"refused"))
    assert _closed(sock) == b""
    server.wait_for_log("queue name of 9 bytes; at most 8 are allowed")
    sock.close()


def test_emqp_max_frames_sends_a_zmtp_error_then_closes(start_server):
    server = start_server(f"--protocol=emqp:{LISTEN}", f"--emqp-backend={LISTEN}",
                          f"--emqp-admin={LISTEN}", "--storage=memory", "--emqp-max-frames=4")
    sock = socket.create_connection(("127.0.0.1", server.ports["emqp"]), timeout=10)
    sock.sendall(zmtp.greeting(1) + zmtp.ready_command(b"DEALER", b"client"))
    sock.sendall(zmtp.encode_message([b""] * 5))
    data = _closed(sock)
    sock.close()
    decoded = MessageDecoder(1 << 20, 64).feed(data[zmtp.GREETING_SIZE:])
    commands = [zmtp.parse_command(body) for body in decoded if isinstance(body, bytes)]
    assert [name for name, _ in commands] == [b"READY", b"ERROR"]
    assert b"more than 4 frames" in commands[1][1]


def test_max_names_per_request_reaches_mqks_and_emqp(start_server, line_client):
    """An MQKS consume naming too many events gets an error reply; an eMQP
    worker's INFORM declaring too many queues is dropped (no ACK) with a log line."""
    server = start_server(f"--protocol=mqks:{LISTEN}", f"--protocol=emqp:{LISTEN}",
                          f"--emqp-backend={LISTEN}", f"--emqp-admin={LISTEN}",
                          "--storage=memory", "--max-names-per-request=3")
    mqks = line_client(server.ports["mqks"])
    events = " ".join(f"e{n}" for n in range(100_000))  # one 600 kB line
    mqks.send(f"c2 consume --confirm q {events}", "c1 consume --confirm q e1 e2 e3")
    replies = mqks.read(2)
    assert EID.match(replies[0]) and replies[1] == b"c1 ok "
    server.wait_for_log("more than 3 names in one request (--max-names-per-request)")

    context = zmq.Context()
    worker = context.socket(zmq.DEALER)
    worker.setsockopt(zmq.LINGER, 0)
    worker.connect(f"tcp://127.0.0.1:{server.ports['emqp-backend']}")
    try:
        def inform(queues: list) -> list[bytes] | None:
            msgid = str(uuid.uuid4()).encode()
            worker.send_multipart([b"", b"eMQP/1.0", b"INFORM", msgid,
                                   json.dumps(queues).encode(), b"worker"])
            while worker.poll(2000):
                frames = worker.recv_multipart()
                if frames[2] == b"ACK" and frames[4] == msgid:
                    return frames
            return None

        assert inform([[1, f"q{n}"] for n in range(1000)]) is None
        server.wait_for_log("more than 3 worker queues in one INFORM")
        assert inform([[10, "a"], [5, "b"], [1, "c"]]) is not None
    finally:
        worker.close(0)
        context.term()
