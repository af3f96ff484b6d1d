# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""What an eMQP request carries through the queue core, and back out to a worker.

A REQUEST becomes a core message whose headers (str -> str) keep what the
core does not model: the queue the client named, its headers frame, the
client to answer and how the request is tracked.  ``request_frames`` turns
such a message (or any other protocol's) back into the REQUEST a worker gets.
"""

from __future__ import annotations

from mqserver.broker.core import MAX_RETRIES
from mqserver.model import Message
from mqserver.protocols.emqp import codec

H_QUEUE = "emqp-queue"
H_HEADERS = "emqp-headers"
H_CLIENT = "emqp-client"
H_TRACK = "emqp-track"
H_REPLY = "emqp-reply"
H_TIMEOUT = "emqp-timeout"



def request_fields(queue: bytes, header_frame: bytes, client: bytes | None) -> dict[str, str]:
    """The fields a REQUEST's message carries: its queue, client, tracking and headers."""
    headers = codec.parse_headers(header_frame)
    retries = headers.number("retry-count")
    timeout = headers.number("timeout")
    tracked = bool(headers.reply_requested or headers.guarantee or retries or timeout)
    forward = header_frame
    fields = {H_QUEUE: codec.text(queue)}
    if client is not None:
        fields[H_CLIENT] = client.hex()
    if tracked:
        fields[H_TRACK] = "1"
        if not headers.reply_requested:
            forward = forward + b",reply-requested" if forward else b"reply-requested"
        if retries is not None:
            fields[MAX_RETRIES] = str(retries)
        elif not headers.guarantee:
            fields[MAX_RETRIES] = "0"
        if timeout:
            fields[H_TIMEOUT] = str(timeout)
    if headers.reply_requested and client is not None:
        fields[H_REPLY] = "1"
    fields[H_HEADERS] = codec.text(forward)
    return fields


def request_frames(message: Message) -> bytes:
    """The REQUEST a worker gets, encoded; messages from other protocols get empty headers."""
    fields = message.headers or {}
    queue = codec.raw(fields[H_QUEUE]) if H_QUEUE in fields else message.queue
    headers = codec.raw(fields.get(H_HEADERS, ""))
    return codec.encode(codec.REQUEST, message.id, queue, headers, message.body)
