"""The input limits as ``twistd mqserver`` options, against the real server.

The unit tests (tests/unit/test_limits.py) cover every rule; this checks that
``--max-name-bytes``, ``--max-id-bytes`` and ``--emqp-max-frames`` reach the
protocols of a running server, over real sockets.
"""

from __future__ import annotations

import re
import socket

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
