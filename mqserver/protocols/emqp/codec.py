# -*- test-case-name: tests.unit.test_emqp_codec -*-
"""eMQP frame layouts, headers, worker queue lists and schedule hashes: no I/O.

Layouts are the ones eventmq 0.3.13 really sends (see docs/protocols/emqp.md),
not the spec's tables where they disagree.  After the ROUTER identity every
message is ``'' | eMQP/1.0 | COMMAND | MSGID | body...``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

from mqserver.limits import Limits
from mqserver.zmtp import codec as zmtp

VERSION = b"eMQP/1.0"
DEFAULT_QUEUE = b"default"
DEFAULT_WEIGHT = 10

ACK = b"ACK"
DISCONNECT = b"DISCONNECT"
HEARTBEAT = b"HEARTBEAT"
INFORM = b"INFORM"
KBYE = b"KBYE"
KBAI = b"KBAI"
PUBLISH = b"PUBLISH"
READY = b"READY"
REPLY = b"REPLY"
REQUEST = b"REQUEST"
SCHEDULE = b"SCHEDULE"
UNSCHEDULE = b"UNSCHEDULE"
ERROR = b"ERROR"
"""To a client: ``ERROR <msgid> <its request's msgid> <code> <text>``; the request was not taken."""
QUEUE_FULL = b"QueueFull"
STATUS = b"STATUS"
SHOW_WORKERS = b"ROUTER_SHOW_WORKERS"
SHOW_SCHEDULERS = b"ROUTER_SHOW_SCHEDULERS"

WORKER = b"worker"
SCHEDULER = b"scheduler"

TIMEOUT_ERROR = "TimeoutError"
"""The value eventmq's worker replies with when it killed a job for its timeout."""


class EMQPError(ValueError):
    """A malformed message: it is dropped with a log line."""


# Envelope and Request are built for every message: not frozen, as a frozen
# dataclass costs about 0.8 us more to build (CPython 3.11); nothing changes them.
@dataclass(slots=True)
class Envelope:
    command: bytes
    msgid: bytes
    body: list[bytes]


def parse(frames: list[bytes], limits: Limits | None = None) -> Envelope:
    """Split a message (identity already removed) into command, msgid and body.

    Like the original, the version frame is not checked, so a peer speaking
    a later minor revision still gets through.  With ``limits`` the msgid
    must obey the server's id rules (``--max-id-bytes``).
    """
    if len(frames) < 4:
        raise EMQPError(f"an eMQP message has at least 4 frames, got {len(frames)}")
    if frames[0]:
        raise EMQPError("the first eMQP frame must be empty")
    if limits is not None:
        limits.check_id(frames[3], "msgid", EMQPError)
    return Envelope(frames[2].upper(), frames[3], frames[4:])


_HEX2 = [b"%02x" % n for n in range(256)]


class MsgIds:
    """Msgids shaped like eventmq's ``str(uuid4())``, cheaply: every answer to a
    request needs one.

    A random version-4 uuid is drawn once; each id is its first 20 hex digits
    and a 48-bit counter that starts at the uuid's own last 12 digits (or
    ``start``), so ids are unique for 2**48 answers (and random across
    restarts).  All but the last two digits change once in 256 ids, so they
    are formatted then and an id is joined from that block and a table
    entry: a tenth of the cost of 16 fresh random bytes (a system call and
    formatting), a third of formatting the counter each time.
    """

    def __init__(self, start: int | None = None) -> None:
        h = os.urandom(16).hex()
        variant = "89ab"[int(h[16], 16) & 3]
        self._prefix = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-".encode("ascii")
        self._next = int(h[20:], 16) if start is None else start
        self._block = self._block_of(self._next)

    def _block_of(self, n: int) -> bytes:
        """The uuid prefix and the first 10 of the 12 counter digits of id ``n``."""
        return b"%b%010x" % (self._prefix, (n >> 8) & ((1 << 40) - 1))

    def __call__(self) -> bytes:
        return self.between(b"", b"")

    def between_each(self, head: bytes, last_frames: list[bytes]) -> bytes:
        """``between(head, frame)`` for each of ``last_frames`` encoded as a
        last ZMTP frame, in one join (the REPLYs to a run of requests: each
        frame's header from zmtp's table, the body not copied before the join)."""
        n, block = self._next, self._block
        short_last, max_short = zmtp.SHORT_LAST, zmtp.MAX_SHORT
        parts: list[bytes] = []
        for body in last_frames:
            low = n & 0xFF
            if not low:
                block = self._block_of(n)
            size = len(body)
            parts += (head, block, _HEX2[low],
                      short_last[size] if size <= max_short else zmtp.last_header(size), body)
            n += 1
        self._next, self._block = n, block
        return b"".join(parts)

    def between(self, head: bytes, tail: bytes) -> bytes:
        """``head + self() + tail`` in one join (for every REPLY)."""
        n = self._next
        self._next = n + 1
        low = n & 0xFF
        if not low:
            self._block = self._block_of(n)
        return b"".join((head, self._block, _HEX2[low], tail))


new_msgid = MsgIds()
"""A fresh msgid (``MsgIds``), for answers and the requests schedules make."""


def message(command: bytes, *body: bytes, msgid: bytes | None = None) -> list[bytes]:
    return [b"", VERSION, command, msgid if msgid is not None else new_msgid(), *body]


_PREFIXES: dict[bytes, bytes] = {}


def encode(command: bytes, msgid: bytes, *body: bytes) -> bytes:
    """``message(command, *body, msgid=msgid)`` as ZMTP frames, ready to send.

    The first three frames (empty, version, command) are encoded once per
    command: this runs for every request forwarded and every answer."""
    prefix = _PREFIXES.get(command)
    if prefix is None:
        prefix = _PREFIXES[command] = zmtp.encode_message([b"", VERSION, command, b""])[:-2]
    return prefix + zmtp.encode_message((msgid, *body))


_REPLY_HEAD = zmtp.encode_message([b"", VERSION, REPLY, bytes(36), b""])[:-38]
"""``'' | eMQP/1.0 | REPLY`` and the header of a 36-byte msgid frame (``new_msgid``'s
size): a REPLY with the msgid's bytes and the empty last frame cut off."""


def encode_replies(request_msgids: list[bytes]) -> bytes:
    """``encode_reply`` for each, in one join: the answers to a run of stored
    requests, without a call per request."""
    return new_msgid.between_each(_REPLY_HEAD, request_msgids)


def encode_reply(request_msgid: bytes) -> bytes:
    """``encode(REPLY, new_msgid(), request_msgid)``, the answer to every stored
    REQUEST, from a prefix encoded once."""
    return new_msgid.between(_REPLY_HEAD, zmtp.last_header(len(request_msgid)) + request_msgid)


def text(value: bytes) -> str:
    """Bytes as a str that round-trips exactly (for message headers and records)."""
    return value.decode("latin-1")


def raw(value: str) -> bytes:
    return value.encode("latin-1")


@dataclass(slots=True)
class Headers:
    """The CSV header frame: ``flag`` or ``name:number`` items."""

    flags: set[str] = field(default_factory=set)
    values: dict[str, int] = field(default_factory=dict)

    @property
    def reply_requested(self) -> bool:
        return "reply-requested" in self.flags

    @property
    def guarantee(self) -> bool:
        return "guarantee" in self.flags

    @property
    def nohaste(self) -> bool:
        return "nohaste" in self.flags

    def number(self, name: str) -> int | None:
        return self.values.get(name)


def parse_headers(frame: bytes) -> Headers:
    """Numbers must be non-negative integers; anything else makes the message malformed."""
    headers = Headers()
    if not frame:  # the usual case
        return headers
    for item in text(frame).split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition(":")
        if not sep:
            headers.flags.add(name)
            continue
        try:
            number = int(value)
        except ValueError:
            raise EMQPError(f"header {name!r} needs a whole number, got {value!r}") from None
        if number < 0:
            raise EMQPError(f"header {name!r} cannot be negative")
        headers.values[name] = number
    return headers


def format_headers(headers: Headers) -> bytes:
    items = sorted(headers.flags) + [f"{k}:{v}" for k, v in sorted(headers.values.items())]
    return raw(",".join(items))


_S = r"[ \t\n\r]*"  # JSON's whitespace (str.strip and \s take more)
_LIST_OPEN = re.compile(_S + r"\[")
# one [weight, "name"] entry of the list, then what follows it: "," or the closing "]"
_WORKER_QUEUE = re.compile(
    rf'{_S}\[{_S}(-?(?:0|[1-9][0-9]*)){_S},{_S}("(?:[^"\\\x00-\x1f]|\\.)*"){_S}\]{_S}([,\]])'
)
_JSON_END = re.compile(_S + r"\Z")


def parse_worker_queues(frame: bytes, limits: Limits | None = None) -> list[tuple[int, bytes]]:
    """``[[10, "default"], [5, "email"]]`` -> weights and names; empty means default.

    With ``limits`` every name must obey the server's name rules and there
    may be at most ``max_names`` entries (``--max-names-per-request``).  The
    list is read one entry at a time, not by ``json.loads`` of the whole
    frame: a 64 MiB frame of ``[1,"a"]`` entries was 8 million lists, about
    1 GB and 9 s of the reactor, before any count could be checked.  What it
    accepts is what JSON reads as a list of [integer, string] pairs.
    """
    if not frame.strip():
        return [(DEFAULT_WEIGHT, DEFAULT_QUEUE)]
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise EMQPError(f"worker queues are not JSON: {frame[:100]!r}") from None
    opened = _LIST_OPEN.match(text)
    if opened is None:
        raise EMQPError("worker queues must be a non-empty JSON list")
    most = limits.max_names if limits is not None else None
    queues: list[tuple[int, bytes]] = []
    pos = opened.end()
    while True:
        entry = _WORKER_QUEUE.match(text, pos)
        if entry is None:
            raise EMQPError(f"a worker queue must be [weight, name], got {text[pos:pos + 100]!r}")
        try:
            weight, name = int(entry[1]), json.loads(entry[2])
            encoded = name.encode("utf-8", "surrogateescape")
        except ValueError:  # a weight of thousands of digits, a bad escape, a lone surrogate
            raise EMQPError(f"a worker queue must be [weight, name], got {entry[0][:100]!r}"
                            ) from None
        if not encoded:
            raise EMQPError("a worker queue needs a name")
        if limits is not None:
            limits.check_name(encoded, "worker queue name", EMQPError)
        queues.append((weight, encoded))
        if most is not None and len(queues) > most:
            raise EMQPError(f"more than {most} worker queues in one INFORM "
                            "(--max-names-per-request)")
        pos = entry.end()
        if entry[3] == "]":
            break
    if _JSON_END.match(text, pos) is None:
        raise EMQPError(f"worker queues are not JSON: {frame[:100]!r}")
    return queues


@dataclass(slots=True)
class Request:
    queue: bytes
    headers: bytes
    payload: bytes


def check_job(queue: bytes, headers: bytes, limits: Limits | None) -> None:
    """A REQUEST's or SCHEDULE's queue name and header count obey ``limits``.

    An empty queue is allowed: it means the default queue, as in eventmq.
    """
    if limits is None:
        return
    if queue:
        limits.check_name(queue, "queue name", EMQPError)
    items = sum(1 for item in headers.split(b",") if item.strip()) if headers else 0
    limits.check_headers(items, "header items", EMQPError)


def parse_request(body: list[bytes], limits: Limits | None = None) -> Request:
    if len(body) < 3:
        raise EMQPError("REQUEST needs queue, headers and message frames")
    check_job(body[0], body[1], limits)
    return Request(body[0], body[1], body[2])


@dataclass(frozen=True, slots=True)
class Schedule:
    queue: bytes
    headers: bytes
    interval: int
    payload: bytes
    cron: bytes


def parse_schedule(body: list[bytes], limits: Limits | None = None) -> Schedule:
    """SCHEDULE/UNSCHEDULE: queue, headers, interval (-1 = cron), message, cron."""
    if len(body) < 3:
        raise EMQPError("SCHEDULE needs at least queue, headers and interval frames")
    check_job(body[0], body[1], limits)
    if len(body) == 3:  # the spec's 7-frame form: queue, headers, message
        return Schedule(body[0], body[1], -1, body[2], b"")
    try:
        interval = int(body[2])
    except ValueError:
        raise EMQPError(f"interval must be a whole number, got {body[2][:50]!r}") from None
    cron = body[4] if len(body) > 4 else b""
    return Schedule(body[0], body[1], interval, body[3], cron)


_HASH_KEYS = ("args", "kwargs", "class_args", "class_kwargs", "path", "callable")


def schedule_hash(payload: bytes) -> str:
    """eventmq's job key: sha1 of the sorted JSON of the ``run`` options."""
    try:
        options = json.loads(payload)[1]
        items = json.dumps({key: options[key] for key in _HASH_KEYS}, sort_keys=True)
    except (ValueError, UnicodeDecodeError, LookupError, TypeError):
        raise EMQPError(
            "a scheduled message must be JSON [\"run\", {path, callable, args, kwargs, "
            "class_args, class_kwargs}]"
        ) from None
    return hashlib.sha1(items.encode("utf-8")).hexdigest()


def is_timeout_reply(result: bytes) -> bool:
    """True for the ``{"value": "TimeoutError"}`` eventmq's worker sends for a killed job."""
    if TIMEOUT_ERROR.encode("ascii") not in result:
        return False
    try:
        value = json.loads(result)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(value, dict) and value.get("value") == TIMEOUT_ERROR
