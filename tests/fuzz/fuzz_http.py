"""Fuzz target: HTTP/1.1 bytes into the real API site (twisted.web's parser and our routes).

First byte: bit 0 builds whole requests from the bytes (method, path, query,
headers and a JSON-ish body chosen by ``FuzzedDataProvider``, batches too, with the
right token most of the time) instead of feeding the bytes as they are, and
the rest is the chunk size.  Time then moves on, so long polls and consumer
leases expire.  Bugs: an exception out of ``dataReceived``, a logged failure
(a 500 logs one), or a body kept beyond ``--http-max-body``.
"""

from __future__ import annotations

import json

from fuzzlib import LIMITS, World, atheris, checked, main
from twisted.internet.protocol import connectionDone

with atheris.instrument_imports(include=["mqserver"]):
    from mqserver.web.app import build_site

TOKEN = "fuzz-token"
MAX_BODY = 4096
METHODS = [b"GET", b"HEAD", b"PUT", b"POST", b"DELETE", b"PATCH", b"OPTIONS", b"G\x00T"]
PATHS = [
    b"/", b"/health", b"/metrics", b"/openapi.json", b"/dashboard", b"/api/overview",
    b"/api/queues", b"/api/queues/{q}", b"/api/queues/{q}/purge", b"/api/queues/{q}/messages",
    b"/api/queues/{q}/consume", b"/api/queues/{q}/ack", b"/api/queues/{q}/reject",
    b"/api/queues/{q}/bindings", b"/api/queues/{q}/bindings/{q}", b"/api/events/{q}",
    b"/api/queues/{q}/messages/batch", b"/api/events/{q}/batch",
    b"/api/consumers", b"/api/connections", b"/api/connections/{q}", b"/static/{q}",
]
NAMES = [b"q", b"q2", b"e.x", b"%00", b"%ff%fe", b"a%2Fb", b"", b"x" * 70, b"..", b"*"]
KEYS = ["body", "body_base64", "id", "ttl", "durable", "headers", "bindings", "replace",
        "remove", "remove_masks", "add", "dead_letter", "max_length", "overflow",
        "default_ttl", "delete_when_unused", "consumer", "max", "timeout", "lease", "ids",
        "reason"]
VALUES = [None, True, 0, -1, 1, 2.5, 1e308, "q", "", "aGk=", "not base64", [], ["q", "e.*"],
          [1], {}, {"a": "b"}, "x" * 70, "\u0000", "\udc80", 2**70, "reject-publish", "drop-head"]


def structured(data: bytes) -> bytes:
    fdp = atheris.FuzzedDataProvider(data)
    out = []
    while fdp.remaining_bytes() > 1:
        path = fdp.PickValueInList(PATHS).replace(b"{q}", fdp.PickValueInList(NAMES)
                                                  if fdp.ConsumeBool() else fdp.ConsumeBytes(8))
        if fdp.ConsumeBool():
            path += b"?" + fdp.PickValueInList([b"limit=1", b"limit=x", b"prefix=q", b"id=1&ttl=-1",
                                                b"durable=true", b"limit=99999999999"])
        obj = {fdp.PickValueInList(KEYS): fdp.PickValueInList(VALUES)
               for _ in range(fdp.ConsumeIntInRange(0, 5))}
        body = json.dumps(obj).encode() if fdp.ConsumeIntInRange(0, 3) else \
            fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 60))
        if fdp.ConsumeIntInRange(0, 3) == 0:  # a batch of copies: a JSON array, or NDJSON
            copies = [body] * fdp.ConsumeIntInRange(0, 4)
            body = b"[" + b",".join(copies) + b"]" if fdp.ConsumeBool() else b"\n".join(copies)
        headers = [b"Host: fuzz"]
        if fdp.ConsumeIntInRange(0, 4):
            headers.append(b"Authorization: Bearer " + TOKEN.encode())
        if fdp.ConsumeBool():
            headers.append(b"Content-Type: " + fdp.PickValueInList(
                [b"application/json", b"text/plain", b"application/x-www-form-urlencoded",
                 b"application/x-ndjson"]))
        if fdp.ConsumeIntInRange(0, 7):
            headers.append(b"Content-Length: %d" % len(body))
        else:
            headers.append(b"Content-Length: %d" % fdp.ConsumeIntInRange(0, 10**7))
        method = fdp.PickValueInList(METHODS)
        out.append(method + b" " + path + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n"
                   + body)
    return b"".join(out)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    with checked():
        world = World()
        site = build_site(world.broker, token=TOKEN, max_body=MAX_BODY, limits=LIMITS)
        site.reactor = world.clock
        world.broker.declare_queue(b"q")
        world.broker.publish_to_queue(b"q", b"m1", b"hello", None, None, "fuzz")
        channel, wire = world.connect(site)
        stream = structured(data[1:]) if data[0] & 1 else data[1:]

        def bounded() -> None:
            world.turn()
            for request in channel._channel.requests:
                content = getattr(request, "content", None)
                if content is not None and content.tell() > MAX_BODY:
                    raise AssertionError(f"{content.tell()} body bytes kept")

        world.feed(channel, wire, stream, data[0] >> 1, bounded)
        world.turn(61)
        world.turn(3600)
        channel.connectionLost(connectionDone)
        site.api.consumers.close_all("fuzz input done")
        world.turn(3600)


if __name__ == "__main__":
    main(test_one_input)
