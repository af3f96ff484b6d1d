"""What a pyzmq DEALER client costs per eMQP W1 message with no broker work at all.

``python -m bench.zmq_floor [--messages N]``

W1 over eMQP moves 11 frames each way per message on one client: a
7-frame REQUEST and a 4-frame READY out, a 7-frame REQUEST and a 5-frame
REPLY in (one frame less here, as a DEALER drops nothing).  This sends
those frames (as eventmq's peers send them: a fresh 36-byte msgid in each,
``bench.clients.emqp.UuidIds``) through pyzmq's compiled ``send``/``recv`` to a ROUTER in
another process that only sinks them, then receives pre-built ones that
are already queued, and reports the client process's CPU per message (its
libzmq I/O thread included).  One client cannot go faster than the sum,
whatever the broker does: it is the ceiling on eMQP's W1 figure in
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time
from typing import Any

import zmq
import zmq.backend

from bench.clients.emqp import UuidIds

BODY = b"x" * 100
V = b"eMQP/1.0"


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sink(count: int, ports: Any, done: Any) -> None:
    """The peer: take ``2 * count`` messages, then queue ``count`` REQUEST + REPLY pairs."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVHWM, 0)
    router.setsockopt(zmq.SNDHWM, 0)
    ports.put(router.bind_to_random_port("tcp://127.0.0.1"))
    identity = router.recv_multipart()[0]
    for _ in range(2 * count):
        router.recv_multipart()
    ids = UuidIds()
    request = [identity, b"", V, b"REQUEST", ids(), b"default", b"", BODY]
    reply = [identity, b"", V, b"REPLY", ids()]
    for _ in range(count):
        router.send_multipart(request)
        router.send_multipart(reply)
    done.wait(120)
    context.destroy(linger=0)


def measure(count: int) -> tuple[float, float]:
    """(send, receive) CPU seconds per message of this client process."""
    ports: Any = multiprocessing.Queue()
    done = multiprocessing.Event()
    peer = multiprocessing.Process(target=sink, args=(count, ports, done), daemon=True)
    peer.start()
    send, recv, more = zmq.backend.Socket.send, zmq.backend.Socket.recv, zmq.SNDMORE
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 60_000)
    dealer.connect(f"tcp://127.0.0.1:{ports.get(timeout=60)}")
    ids = UuidIds()
    try:
        send(dealer, b"hello")
        started = cpu()
        for _ in range(count):
            send(dealer, b"", more)
            send(dealer, V, more)
            send(dealer, b"REQUEST", more)
            send(dealer, ids(), more)
            send(dealer, b"default", more)
            send(dealer, b"", more)
            send(dealer, BODY)
            send(dealer, b"", more)
            send(dealer, V, more)
            send(dealer, b"READY", more)
            send(dealer, ids())
        sent = cpu() - started
        recv(dealer)  # the first frame back: the peer has all and is answering
        time.sleep(max(1.0, count / 50_000))  # let the rest arrive before counting
        started = cpu()
        for _ in range(11 * count - 1):
            recv(dealer)
        received = cpu() - started
    finally:
        done.set()
        context.destroy(linger=0)
        peer.join(10)
    return sent / count, received / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    sent, received = measure(args.messages)
    total = sent + received
    print(f"pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}, {args.messages} messages")
    print(f"send 11 frames: {sent * 1e6:.2f} us CPU per message (I/O thread included)")
    print(f"recv 11 frames: {received * 1e6:.2f} us CPU per message (already queued)")
    print(f"one client's ceiling with a free broker: {1 / total:,.0f} msgs/s")


if __name__ == "__main__":
    main()
