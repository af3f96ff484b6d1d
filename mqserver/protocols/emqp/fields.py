# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""What an eMQP request carries through the queue core, and back out to a worker.

A REQUEST becomes a core message whose headers (str -> str) keep what the
core does not model: the queue the client named, its headers frame, the
client to answer and how the request is tracked.  ``request_frames`` turns
such a message (or any other protocol's) back into the REQUEST a worker gets;
``RequestFrames`` does the same with the frames its fields give encoded once.
"""

from __future__ import annotations

from mqserver.broker.core import MAX_RETRIES
from mqserver.model import Message
from mqserver.protocols.emqp import codec
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.codec import MAX_SHORT

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


_REQUEST_HEAD = zmtp.encode_message([b"", codec.VERSION, codec.REQUEST, b""])[:-2]
"""``'' | eMQP/1.0 | REQUEST``, each frame with MORE."""


class RequestFrames:
    """``request_frames``, with the queue and headers frames encoded once per fields dict.

    The requests of one client to one queue with one header frame share
    their fields (``EMQPService.publish_request``), so they share those two
    frames too: a delivery is a prefix, the msgid frame, that middle and
    the body frame.  Entries are found by the dict's ``id`` and checked
    with ``is`` (an entry holds its dict, so the id is not reused while
    cached); dicts without the eMQP queue (other protocols' messages, whose
    queue frame is the message's own) take ``request_frames``.
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._middles: dict[int, tuple[dict[str, str], bytes]] = {}

    def __call__(self, message: Message) -> bytes:
        fields = message.headers
        if not fields or H_QUEUE not in fields:
            return request_frames(message)
        cached = self._middles.get(id(fields))
        if cached is None or cached[0] is not fields:
            cached = self._remember(fields)
        msgid, body = message.id, message.body
        id_size, size = len(msgid), len(body)
        return b"".join((  # the headers from zmtp's tables unless long: no call per frame
            _REQUEST_HEAD,
            zmtp.SHORT_MORE[id_size] if id_size <= MAX_SHORT else zmtp.more_header(id_size),
            msgid,
            cached[1],
            zmtp.SHORT_LAST[size] if size <= MAX_SHORT else zmtp.last_header(size),
            body,
        ))

    def _remember(self, fields: dict[str, str]) -> tuple[dict[str, str], bytes]:
        """The queue and headers frames of ``fields``, each with MORE, kept with it."""
        queue, headers = codec.raw(fields[H_QUEUE]), codec.raw(fields.get(H_HEADERS, ""))
        middle = zmtp.encode_message([queue, headers, b""])[:-2]  # the empty last frame cut
        if len(self._middles) >= self.size:
            self._middles.clear()
        entry = self._middles[id(fields)] = (fields, middle)
        return entry
