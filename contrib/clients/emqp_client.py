#!/usr/bin/env python3
"""An eMQP client with plain pyzmq: send a job, get it accepted, get its result.

It connects a DEALER to the broker's *frontend* socket and sends a REQUEST
with ``reply-requested``.  The broker answers ``REPLY <msgid>`` once the
request is stored (it survives a broker restart from then on with a durable
``--storage``), and ``REPLY <result> <msgid>`` when a worker (see
``emqp_worker.py``) has run it.

    python3 emqp_client.py [HOST] [PORT] [--queue Q]      # default 127.0.0.1 47291 default

Prints ``ok ...`` per step and ``done``; exits 1 if an answer does not come
within ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import zmq

VERSION = b"eMQP/1.0"


def receive(socket: zmq.Socket, timeout: float) -> list[bytes]:
    """The next non-HEARTBEAT message, or exit: a missing answer is the failure to show."""
    while True:
        if not socket.poll(int(timeout * 1000)):
            sys.exit(f"FAIL: no answer within {timeout} s")
        frames = socket.recv_multipart()
        if frames[2] != b"HEARTBEAT":
            return frames


def main(host: str, port: int, queue: str, timeout: float) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://{host}:{port}")
    job = json.dumps(["run", {"callable": "add", "path": "example", "args": [2, 3],
                              "kwargs": {}, "class_args": [], "class_kwargs": {}}]).encode()
    msgid = str(uuid.uuid4()).encode()
    socket.send_multipart([b"", VERSION, b"REQUEST", msgid, queue.encode(),
                           b"reply-requested", job])
    accepted = receive(socket, timeout)
    if accepted[2:] != [b"REPLY", accepted[3], msgid]:
        sys.exit(f"FAIL: wanted the accept for {msgid!r}, got {accepted!r}")
    print("ok request stored by the broker")
    result = receive(socket, timeout)
    if result[2] != b"REPLY" or result[-1] != msgid:
        sys.exit(f"FAIL: wanted the result for {msgid!r}, got {result!r}")
    value = json.loads(result[4])["value"]
    if value != 5:
        sys.exit(f"FAIL: 2 + 3 came back as {value!r}")
    print(f"ok result {value}")
    socket.close()
    context.term()
    print("done")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host", nargs="?", default="127.0.0.1")
    parser.add_argument("port", nargs="?", type=int, default=47291)
    parser.add_argument("--queue", default="default")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    main(args.host, args.port, args.queue, args.timeout)
