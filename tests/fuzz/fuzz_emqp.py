"""Fuzz target: ZMTP bytes and eMQP messages into the frontend, backend or admin socket.

A worker is connected, has INFORMed queues ``default`` and ``q`` and has two
free slots, so REQUESTs get delivered and REPLYs have someone to match.
First byte: bits 0-1 pick the socket (frontend twice as often), bit 2 has
the target do the greeting and handshake (clear: they come from the fuzzer
too), bit 3 builds whole eMQP messages from the bytes
(``FuzzedDataProvider``) instead of feeding frames as they are, and the rest
is the chunk size.  Bugs: an exception out of ``dataReceived``, a logged
failure, or more buffered than one frame / one message allows.
"""

from __future__ import annotations

import json

from fuzzlib import LIMITS, World, atheris, checked, main
from twisted.internet.protocol import connectionDone

with atheris.instrument_imports(include=["mqserver"]):
    from mqserver.protocols.emqp import codec
    from mqserver.protocols.emqp.service import EMQPService
    from mqserver.zmtp import codec as zmtp

MAX_MESSAGE = 64 * 1024
MAX_FRAMES = 16
COMMANDS = [
    codec.REQUEST, codec.SCHEDULE, codec.UNSCHEDULE, codec.PUBLISH, codec.INFORM,
    codec.HEARTBEAT, codec.KBYE, codec.KBAI, codec.DISCONNECT, codec.READY, codec.REPLY,
    codec.ACK, codec.STATUS, codec.SHOW_WORKERS, codec.SHOW_SCHEDULERS, b"request", b"",
]
RUN = json.dumps(["run", {"path": "p", "callable": "c", "args": [], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}]).encode()
VALUES = [
    b"", b"default", b"q", b"worker", b"scheduler", b"-1", b"0", b"10", b"1e9", b"* * * * *",
    b"*/5 * * * *", b"61 * * * *", b"reply-requested", b"reply-requested,timeout:1,retry-count:2",
    b"guarantee,nohaste,run_count:2", b"timeout:99999999999999999999", b'[[10, "q"]]',
    b'[[10, "default"], [1, "q"]]', b'[ [1,"a"] ,\n[2, "b\\"c"],[3,"d"],[4,"e"],[5,"f"] ]',
    b'[[1, "a"],]', b"[]", RUN, b'{"value": "TimeoutError"}', b"m1", b"m2",
]


def handshake(identity: bytes) -> bytes:
    return zmtp.greeting(1) + zmtp.ready_command(b"DEALER", identity)


def structured(data: bytes) -> bytes:
    """Whole eMQP messages: command, msgid and body frames chosen by ``data``."""
    fdp = atheris.FuzzedDataProvider(data)
    out = []
    while fdp.remaining_bytes() > 1:
        if fdp.ConsumeIntInRange(0, 15) == 0:
            out.append(zmtp.ping_command(fdp.ConsumeIntInRange(0, 100), fdp.ConsumeBytes(20)))
            continue
        command = fdp.PickValueInList(COMMANDS)
        msgid = fdp.PickValueInList([b"m1", b"m2", b""]) if fdp.ConsumeBool() else \
            fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 70))
        body = [
            fdp.PickValueInList(VALUES) if fdp.ConsumeBool() else
            fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
            for _ in range(fdp.ConsumeIntInRange(0, 6))
        ]
        head = [b"", codec.VERSION] if fdp.ConsumeIntInRange(0, 7) else \
            [fdp.ConsumeBytes(2) for _ in range(fdp.ConsumeIntInRange(0, 2))]
        out.append(zmtp.encode_message([*head, command, msgid, *body]))
    return b"".join(out)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode = data[0]
    with checked():
        world = World()
        service = EMQPService(world.broker, max_message_size=MAX_MESSAGE, max_frames=MAX_FRAMES,
                              limits=LIMITS)
        routers = (service.frontend, service.backend, service.admin)
        for router in routers:
            router.doStart()
        worker, worker_wire = world.connect(service.backend, 4000)
        worker.dataReceived(handshake(b"w1") + zmtp.encode_message(
            codec.message(codec.INFORM, b'[[10, "default"], [5, "q"]]', codec.WORKER, msgid=b"i")
        ) + zmtp.encode_message(codec.message(codec.READY, msgid=b"r1")) * 2)
        router = (service.frontend, service.backend, service.admin, service.frontend)[mode & 3]
        peer, wire = world.connect(router, 4001)
        payload = structured(data[1:]) if mode & 8 else data[1:]
        if mode & 4:
            payload = handshake(b"fuzz") + payload

        def bounded() -> None:
            if peer._decoder.buffered() > MAX_MESSAGE + 9 or peer._decoder.in_progress() > MAX_MESSAGE:
                raise AssertionError("more buffered than the limits allow")
            worker_wire.clear()

        world.feed(peer, wire, payload, mode >> 4, bounded)
        world.turn(30)
        world.turn(400)
        peer.connectionLost(connectionDone)
        worker.connectionLost(connectionDone)
        for router in routers:
            router.doStop()
        world.turn(60)


if __name__ == "__main__":
    main(test_one_input)
