"""Fuzz target: bytes into a real MQKS connection (another connection consumes).

The first byte picks the chunk size the rest is fed in (0: one piece), so
line boundaries fall everywhere.  Bugs: an exception out of
``dataReceived``, a logged failure, or a line buffer above ``--mqks-max-line``.
"""

from __future__ import annotations

from fuzzlib import LIMITS, World, atheris, checked, main
from twisted.internet.protocol import connectionDone

with atheris.instrument_imports(include=["mqserver"]):
    from mqserver.protocols.mqks.protocol import MQKSFactory

MAX_LINE = 4096


def test_one_input(data: bytes) -> None:
    if not data:
        return
    with checked():
        world = World()
        factory = MQKSFactory(world.broker, max_line=MAX_LINE, limits=LIMITS)
        listener, _ = world.connect(factory)
        listener.dataReceived(b"L consume --manual-ack q e1 e2 e.x --delete-queue-when-unused=5\n")
        protocol, transport = world.connect(factory, 5556)

        def bounded() -> None:
            if protocol._pending_size > MAX_LINE:
                raise AssertionError(f"{protocol._pending_size} bytes of line buffered")

        world.feed(protocol, transport, data[1:], data[0] % 32, bounded)
        world.turn(3600)
        protocol.connectionLost(connectionDone)
        listener.connectionLost(connectionDone)
        world.turn(3600)


if __name__ == "__main__":
    main(test_one_input)
