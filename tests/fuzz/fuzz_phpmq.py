"""Fuzz target: PHPMQ frames into a real connection (another connection consumes).

First byte: bit 0 picks the mode, the rest the chunk size.  Raw mode feeds
the bytes as they are, so headers and lengths get mangled; structured mode
builds well-framed messages of any type and package set from the bytes
(``FuzzedDataProvider``), so the handlers behind the decoder get reached.
Bugs: an exception out of ``dataReceived``, a logged failure, or more
buffered than one package header and ``--phpmq-max-content``.
"""

from __future__ import annotations

from fuzzlib import LIMITS, World, atheris, checked, main
from twisted.internet.protocol import connectionDone

with atheris.instrument_imports(include=["mqserver"]):
    from mqserver.protocols.phpmq import codec
    from mqserver.protocols.phpmq.protocol import PHPMQFactory

MAX_CONTENT = 4096
PACKAGE_TYPES = [codec.QUEUE, codec.CONTENT, codec.MESSAGE_ID, codec.COUNT, codec.TTL]


def structured(data: bytes) -> bytes:
    """Well-framed messages: type, package types and contents all chosen by ``data``."""
    fdp = atheris.FuzzedDataProvider(data)
    out = []
    while fdp.remaining_bytes() > 2:
        msg_type = fdp.ConsumeIntInRange(0, 7)
        layout = codec.LAYOUTS.get((msg_type, fdp.ConsumeIntInRange(2, 4)))
        if layout is None or fdp.ConsumeBool():
            count = fdp.ConsumeIntInRange(0, 4)
            layout = tuple(fdp.PickValueInList(PACKAGE_TYPES) for _ in range(count))
        packages = []
        for pkg_type in layout:
            kind = fdp.ConsumeIntInRange(0, 3)
            if kind == 0:
                content = b"%d" % fdp.ConsumeIntInRange(0, 10**6)
            elif kind == 1:
                content = fdp.PickValueInList([b"q", b"q2", b"q-dlq", b"0", b""])
            else:
                content = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80))
            packages.append((pkg_type, content))
        out.append(codec.encode(msg_type, packages))
    return b"".join(out)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    with checked():
        world = World()
        factory = PHPMQFactory(world.broker, max_content=MAX_CONTENT, limits=LIMITS,
                               dead_letter_suffix=b"-dlq" if data[0] & 2 else b"")
        consumer, _ = world.connect(factory)
        consumer.dataReceived(codec.consume(b"q", 3))
        protocol, transport = world.connect(factory, 5556)
        stream = structured(data[1:]) if data[0] & 1 else data[1:]

        def bounded() -> None:
            if not protocol._closing and protocol.decoder.buffered() > MAX_CONTENT + 40:
                raise AssertionError(f"{protocol.decoder.buffered()} bytes buffered")

        world.feed(protocol, transport, stream, data[0] >> 2, bounded)
        world.turn(3600)
        protocol.connectionLost(connectionDone)
        consumer.connectionLost(connectionDone)
        world.turn(3600)


if __name__ == "__main__":
    main(test_one_input)
