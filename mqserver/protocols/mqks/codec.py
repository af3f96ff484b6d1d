# -*- test-case-name: tests.unit.test_mqks_codec -*-
"""MQKS encoding and argument parsing: pure functions, no I/O.

Formats follow the original server byte for byte (see docs/protocols/mqks.md):
a bare confirm is ``{id} ok `` with a trailing space, errors carry a
24-character error id, numbers in ``--update`` are Python float reprs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from mqserver.broker.overflow import OVERFLOW_POLICIES
from mqserver.model import Message

CONFIRM = b"--confirm"
DQWU = b"--delete-queue-when-unused"
MANUAL_ACK = b"--manual-ack"
MAX_LENGTH = b"--max-length="
OVERFLOW = b"--overflow="
ALL = b"--all"
_ALNUM = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Byte values for ``in`` tests on the hot path: ``10 in data`` is one memchr,
# while ``b"\n" in data`` first tries (and fails) to read b"\n" as an int,
# about 1 us per test in CPython 3.11, twice per delivery.
LF = ord("\n")
CR = ord("\r")
SPACE = ord(" ")


class MQKSError(ValueError):
    """A request the server answers with ``{id} error {eid}``."""


def error_id(now: float, random: bytes | None = None) -> bytes:
    """20 digits of UTC date-time with microseconds, then 4 random characters."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d%H%M%S%f").encode("ascii")
    random = random if random is not None else os.urandom(4)
    return stamp + bytes(_ALNUM[b % len(_ALNUM)] for b in random[:4])


def split_confirm(data: bytes) -> tuple[bool, bytes]:
    """``--confirm`` counts only as the first argument."""
    if data.startswith(b"--confirm "):
        return True, data[10:]
    if data == CONFIRM:
        return True, b""
    return False, data


def strip_confirm(data: bytes) -> tuple[bool, bytes]:
    """The original's rule for every action: ``--confirm `` first is stripped.

    Unlike ``split_confirm`` a lone ``--confirm`` stays data: ``p ping --confirm``
    is answered ``p ok --confirm``, as the original did (its prefix test needs
    the space, which the line's rstrip has removed).
    """
    if data.startswith(b"--confirm "):
        return True, data[10:]
    return False, data


def escape_body(body: bytes) -> bytes:
    """Make a body from another protocol fit on one MQKS line.

    MQKS has no escaping; bodies published over MQKS never contain a newline.
    Bodies from PHPMQ, eMQP or HTTP may, so newlines and carriage returns are
    written as JSON-style ``\\n``/``\\r`` (and backslashes doubled).
    """
    if LF not in body and CR not in body:
        return body
    return body.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def delivery(consumer_id: bytes, message: Message) -> bytes:
    event = message.event if message.event is not None else message.queue
    body = message.body
    if LF in body or CR in body:
        body = escape_body(body)
    if message.retry:
        return b"%s ok %s event=%s,retry=%d %s\n" % (
            consumer_id, message.id, event, message.retry, body,
        )
    return b"%s ok %s event=%s %s\n" % (consumer_id, message.id, event, body)


def format_seconds(value: float) -> bytes:
    return repr(float(value)).encode("ascii")


def update_line(
    consumer_id: bytes,
    queue: bytes,
    events: set[bytes],
    delete_when_unused: float | None,
    bare: bool,
    manual_ack: bool,
) -> bytes:
    parts = [consumer_id, b" ok --update ", queue]
    if events:
        parts += [b" ", b" ".join(sorted(events))]
    if delete_when_unused is not None:
        parts.append(b" " + DQWU)
        if not bare:
            parts += [b"=", format_seconds(delete_when_unused)]
    if manual_ack:
        parts.append(b" " + MANUAL_ACK)
    parts.append(b"\n")
    return b"".join(parts)


# a word that is not a flag: the queue, or a name (event or mask); flags,
# repeated or not, are skipped inside the regex engine without an object each
_NAME_WORD = re.compile(rb"(?<![^ ])(?!--)[^ ]+")


def check_names(data: bytes, max_names: int | None) -> None:
    """Refuse a consume or rebind that lists more than ``max_names`` names before it is split.

    A 16 MiB line of one-byte events split at once would be millions of
    bytes objects; the words that are not flags (the queue, then the names)
    are counted first, and only a line with that many spaces is walked, and
    only up to the limit, so what a refused request costs is bounded by the
    limit.  The count is exact: it refuses what the parsed request's names
    would, no more.
    """
    if max_names is None:
        return
    most = max_names + 1  # the queue
    if data.count(b" ") < most:
        return
    if next(islice(_NAME_WORD.finditer(data), most, None), None) is not None:
        raise MQKSError(f"more than {max_names} names in one request (--max-names-per-request)")


@dataclass
class ConsumeArgs:
    confirm: bool
    queue: bytes
    replace: list[bytes] = field(default_factory=list)
    add: list[bytes] = field(default_factory=list)
    delete_when_unused: float | None = None
    bare: bool = False
    manual_ack: bool = False
    has_add: bool = False
    # extensions (not in the original): set when given, kept when omitted
    max_length: int | None = None
    overflow: str | None = None


def parse_consume(data: bytes, max_names: int | None = None) -> ConsumeArgs:
    """``[--confirm] {queue} [ev…] [--add ev…] [--delete-queue-when-unused[=s]] [--manual-ack]``
    ``[--max-length=N] [--overflow=drop-head|reject-publish]``

    A line with more than ``max_names`` events (plus its flags) is refused
    before it is split (``check_names``); the protocol checks the exact count."""
    check_names(data, max_names)
    confirm, data = split_confirm(data)
    args = ConsumeArgs(confirm, b"")
    target = args.replace
    for part in data.split(b" "):
        if not part:
            continue
        if part.startswith(b"--"):
            if part == DQWU:
                args.delete_when_unused, args.bare = 0.0, True
            elif part.startswith(DQWU + b"="):
                args.delete_when_unused, args.bare = parse_seconds(part[len(DQWU) + 1 :]), False
            elif part == MANUAL_ACK:
                args.manual_ack = True
            elif part == b"--add":
                target = args.add
                args.has_add = True
            elif part.startswith(MAX_LENGTH):
                args.max_length = parse_count(part[len(MAX_LENGTH) :])
            elif part.startswith(OVERFLOW):
                args.overflow = parse_overflow(part[len(OVERFLOW) :])
            else:
                raise MQKSError(f"unknown consume flag {part!r}")
        elif not args.queue:
            args.queue = part
        else:
            target.append(part)
    if not args.queue:
        raise MQKSError("consume needs a queue")
    return args


def parse_count(text: bytes) -> int:
    """``--max-length=N``: a positive whole number of messages."""
    if not text.isdigit() or int(text) < 1:
        raise MQKSError(f"--max-length needs a positive number, not {text!r}")
    return int(text)


def parse_overflow(text: bytes) -> str:
    policy = text.decode("ascii", "replace")
    if policy not in OVERFLOW_POLICIES:
        raise MQKSError(f"--overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
    return policy


def parse_seconds(text: bytes) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MQKSError(f"bad number of seconds {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise MQKSError(f"bad number of seconds {text!r}")
    return value


@dataclass
class RebindArgs:
    confirm: bool
    queue: bytes
    replace: list[bytes] = field(default_factory=list)
    remove: list[bytes] = field(default_factory=list)
    remove_mask: list[bytes] = field(default_factory=list)
    add: list[bytes] = field(default_factory=list)

    @property
    def remove_all(self) -> bool:
        return not (self.replace or self.remove or self.remove_mask or self.add)


_REBIND_FLAGS = {b"--remove": "remove", b"--remove-mask": "remove_mask", b"--add": "add"}


def parse_rebind(data: bytes, max_names: int | None = None) -> RebindArgs:
    """``[--confirm] {queue} [ev…] [--remove ev…] [--remove-mask m…] [--add ev…]``

    Refused before it is split with more than ``max_names`` names (``check_names``)."""
    check_names(data, max_names)
    confirm, data = split_confirm(data)
    queue, _, rest = data.partition(b" ")
    if not queue or queue.startswith(b"--"):
        raise MQKSError("rebind needs a queue")
    args = RebindArgs(confirm, queue)
    target = args.replace
    for part in rest.split(b" "):
        if not part:
            continue
        if part.startswith(b"--"):
            attr = _REBIND_FLAGS.get(part)
            if attr is None:
                raise MQKSError(f"unknown rebind flag {part!r}")
            target = getattr(args, attr)
        else:
            target.append(part)
    return args


def parse_settle(data: bytes) -> tuple[bool, bytes, bytes]:
    """``[--confirm] {consumer_id} {msg_id|--all}`` for ack and reject."""
    parts = data.split(b" ")
    if len(parts) == 2 and parts[0] != CONFIRM and parts[0] and parts[1]:
        return False, parts[0], parts[1]  # the common case: no --confirm
    confirm, data = split_confirm(data)
    parts = data.split(b" ")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise MQKSError("expected a consumer id and a message id or --all")
    return confirm, parts[0], parts[1]


def parse_settle_words(words: list[bytes]) -> tuple[bool, bytes, bytes]:
    """``parse_settle`` of a request line split into at most four words.

    ``words`` is ``line.split(b" ", 3)``: id, action, then (usually) the
    consumer id and the message id, which need no further split.
    """
    if len(words) == 4:
        consumer_id, message_id = words[2], words[3]
        if consumer_id and consumer_id != CONFIRM and message_id and SPACE not in message_id:
            return False, consumer_id, message_id  # the common case: no --confirm
    return parse_settle(request_data(words))


def request_data(words: list[bytes]) -> bytes:
    """A request's data, everything after its action, from ``line.split(b" ", 3)``."""
    return b" ".join(words[2:])


def with_data(
    handler: Callable[[Any, bytes, bytes], None],
) -> Callable[[Any, bytes, list[bytes]], None]:
    """A handler of (protocol, request id, data) as one of (protocol, request id, words)."""

    def call(protocol: Any, request_id: bytes, words: list[bytes]) -> None:
        handler(protocol, request_id, request_data(words))

    return call


def parse_single(data: bytes, what: str) -> tuple[bool, bytes]:
    """``[--confirm] {name}`` for delete_consumer and delete_queue."""
    confirm, data = split_confirm(data)
    if not data or b" " in data:
        raise MQKSError(f"expected one {what}")
    return confirm, data


def parse_eval(data: bytes) -> tuple[int | None, str]:
    """``[--worker=n] {code}``"""
    worker = None
    if data.startswith(b"--worker="):
        flag, _, data = data.partition(b" ")
        try:
            worker = int(flag[9:])
        except ValueError:
            raise MQKSError(f"bad worker {flag!r}") from None
    try:
        return worker, data.decode("utf-8")
    except UnicodeDecodeError:
        raise MQKSError("_eval code is not UTF-8") from None
