#!/usr/bin/env python3
"""An eMQP worker with plain pyzmq: what eventmq's job manager does, in one page.

It connects a DEALER to the broker's *backend* socket, INFORMs the queues it
serves, sends one READY per job it can take, runs each REQUEST and REPLYs
with the result (which the broker forwards to a client that asked for it
with ``reply-requested``).  The job is eventmq's ``["run", {...}]`` JSON; this
worker knows one callable, ``add``, so the example needs no code loading.

    python3 emqp_worker.py [HOST] [BACKEND_PORT] [--jobs N]   # default 127.0.0.1 47290, forever

Prints ``ok ...`` per job and ``done`` after ``--jobs`` jobs (then says KBYE).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import zmq

VERSION = b"eMQP/1.0"
HEARTBEAT_EVERY = 1.0  # the broker drops a worker silent for --emqp-peer-timeout (5 s)


def send(socket: zmq.Socket, command: bytes, *body: bytes) -> None:
    """Every eMQP message: empty delimiter, version, command, a fresh msgid, body."""
    socket.send_multipart([b"", VERSION, command, str(uuid.uuid4()).encode(), *body])


def run(job: bytes) -> dict[str, object]:
    """Run one eventmq job; unknown callables answer an error instead of crashing the worker."""
    _, call = json.loads(job)
    if call.get("callable") == "add":
        return {"value": sum(call.get("args", []))}
    return {"value": "UnknownCallable", "error": f"no callable {call.get('callable')!r}"}


def main(host: str, port: int, queues: list[str], jobs: int | None) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(f"tcp://{host}:{port}")
    send(socket, b"INFORM", json.dumps([[10, q] for q in queues]).encode(), b"worker")
    send(socket, b"READY")
    done = 0
    last_beat = time.monotonic()
    while jobs is None or done < jobs:
        if socket.poll(int(HEARTBEAT_EVERY * 1000)):
            frames = socket.recv_multipart()
            command = frames[2]
            if command == b"REQUEST":
                msgid, queue, _headers, job = frames[3:7]
                send(socket, b"REPLY", json.dumps(run(job)).encode(), msgid)
                send(socket, b"READY")  # one slot back: ready for the next job
                done += 1
                print(f"ok ran a job from {queue.decode()}", flush=True)
            elif command == b"ACK":
                print("ok registered", flush=True)
        if time.monotonic() - last_beat >= HEARTBEAT_EVERY:
            send(socket, b"HEARTBEAT", str(time.time()).encode())
            last_beat = time.monotonic()
    send(socket, b"KBYE")
    socket.close()
    context.term()
    print("done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host", nargs="?", default="127.0.0.1")
    parser.add_argument("port", nargs="?", type=int, default=47290)
    parser.add_argument("--queue", action="append", help="queue to serve (repeatable)")
    parser.add_argument("--jobs", type=int, help="exit after this many jobs")
    args = parser.parse_args()
    main(args.host, args.port, args.queue or ["default"], args.jobs)
