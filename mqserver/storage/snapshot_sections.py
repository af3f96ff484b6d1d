# -*- test-case-name: tests.unit.test_snapshot -*-
"""The sections of a clean-shutdown snapshot: how the state and each chunk are laid out.

``SectionWriter`` collects a section's payload as parts (a chunk's joined
bodies are written as they are, never copied); ``SectionReader`` reads one
back with every length and count checked against what is left of the
section, so nothing allocates more than the section holds.  Integers and
floats are little-endian ``struct`` values; an optional value is a flag
byte, or for bytes a length of 2**64 - 1; arrays are a typecode and their
``tobytes`` (in the byte order the file's header names).

A chunk's section holds the ``Chunk``'s columns as they are (see
``mqserver.packed``): ids and bodies joined, with their ends or their one
length; the seqs (the first alone when consecutive); queue, event and
source as one shared value or a table of the distinct ones and an index
per message; headers as JSON, one shared or one per message; times and
retries as arrays.  Reading it builds the ``Chunk`` directly, no
``Message`` made.  ``mqserver.storage.snapshot`` puts the sections in a
file.
"""

from __future__ import annotations

import json
import math
import struct
from array import array
from typing import Any, NamedTuple

from mqserver.model import Message, QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import CHUNK, Backlog, Chunk, ChunkParts

_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_I64, _F64 = struct.Struct("<q"), struct.Struct("<d")
_NONE_LENGTH = (1 << 64) - 1  # the length of an absent optional value


class SnapshotError(Exception):
    """The snapshot cannot be used: missing, stale, truncated, corrupt or foreign."""


class SectionWriter:
    """One section's payload as parts (bodies are written as they are, never copied)."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []

    def u8(self, value: int) -> None:
        self.parts.append(_U8.pack(value))

    def u32(self, value: int) -> None:
        self.parts.append(_U32.pack(value))

    def u64(self, value: int) -> None:
        self.parts.append(_U64.pack(value))

    def i64(self, value: int) -> None:
        self.parts.append(_I64.pack(value))

    def f64(self, value: float) -> None:
        self.parts.append(_F64.pack(value))

    def blob(self, value: bytes | memoryview | None) -> None:
        if value is None:
            self.u64(_NONE_LENGTH)
        else:
            self.u64(len(value))
            self.parts.append(value)

    def text(self, value: str | None) -> None:
        self.blob(None if value is None else value.encode("utf-8", "surrogatepass"))

    def opt_f64(self, value: float | None) -> None:
        self.u8(value is not None)
        if value is not None:
            self.f64(value)

    def array(self, values: array[Any]) -> None:
        self.parts.append(values.typecode.encode("ascii"))
        self.blob(memoryview(values).cast("B"))  # its bytes as they are, not a copy


class ChunkEntry(NamedTuple):
    """A chunk's line in the state section: where its section's payload is (its
    length and checksum), what it holds (count, first and last seq) and
    whether any message has a TTL (such a chunk is read at the open)."""

    length: int
    crc: int
    count: int
    first: int
    last: int
    expires: bool


_ENTRY = struct.Struct("<QIIqqB")


def entry_of(chunk: Chunk, length: int, crc: int) -> ChunkEntry:
    seqs = chunk.seq_column()
    return ChunkEntry(length, crc, chunk.count, seqs[0], seqs[-1], chunk.expires is not None)


def state_section(recovered: Recovered, entries: dict[bytes, list[ChunkEntry]]) -> SectionWriter:
    """The state, with every queue's chunks listed (written after them: the
    entries hold their sections' lengths and checksums)."""
    out = SectionWriter()
    out.u64(recovered.next_seq)
    records = {ns: values for ns, values in recovered.records.items() if values}
    out.u32(len(records))
    for namespace, values in records.items():
        out.blob(namespace)
        out.u32(len(values))
        for key, value in values.items():
            out.blob(key)
            out.blob(value)
    out.u32(len(recovered.queues))
    for name, rq in recovered.queues.items():
        out.blob(name)
        o = rq.options
        out.opt_f64(o.delete_when_unused)
        out.u8(o.delete_when_unused_bare)
        out.blob(o.dead_letter)
        out.u8(o.max_length is not None)
        out.i64(o.max_length or 0)
        out.opt_f64(o.default_ttl)
        out.text(o.overflow)
        out.u32(len(rq.bindings))
        for event in sorted(rq.bindings):
            out.blob(event)
        out.u32(len(entries[name]))
        for entry in entries[name]:
            out.parts.append(_ENTRY.pack(*entry))
    return out


def _joined(out: SectionWriter, column: Any) -> None:
    """Ids or bodies: the joined bytes, then each one's end (an array) or, when
    all are as long, that one length."""
    data, ends = column if type(column) is not list else _join(column)
    out.blob(data)
    out.u8(type(ends) is int)
    if type(ends) is int:
        out.u64(ends)
    else:
        out.array(ends)


def _join(values: list[bytes]) -> tuple[bytes, array[int]]:
    data = b"".join(bytes(value) for value in values)
    ends, end = array("Q"), 0
    for value in values:
        end += len(value)
        ends.append(end)
    return data, ends


def _values(out: SectionWriter, column: Any, encode: Any) -> None:
    """A column of immutable values (queue, event, source): one shared value, or a
    table of the distinct ones and an index per message."""
    if type(column) is not list:
        out.u8(0)
        encode(column)
        return
    table: dict[Any, int] = {}
    index = array("I", [table.setdefault(value, len(table)) for value in column])
    out.u8(1)
    out.u32(len(table))
    for value in table:
        encode(value)
    out.array(index)


def _headers(out: SectionWriter, column: Any) -> None:
    """Headers: one dict every message shares (one object, as live), or one each."""
    def encode(value: dict[str, str] | None) -> None:
        out.blob(None if value is None else json.dumps(value).encode("ascii"))

    if type(column) is not list:
        out.u8(0)
        encode(column)
        return
    out.u8(1)
    for value in column:
        encode(value)


def chunk_section(chunk: Chunk) -> SectionWriter:
    out = SectionWriter()
    parts = chunk.parts()
    out.u32(parts.count)
    _joined(out, parts.ids)
    _joined(out, parts.bodies)
    _values(out, parts.queues, out.blob)
    out.array(parts.seqs)  # every seq, or the first alone when consecutive
    _values(out, parts.events, out.blob)
    _headers(out, parts.headers)
    out.array(parts.created)
    out.u8(parts.expires is not None)
    if parts.expires is not None:
        out.array(parts.expires)
        out.f64(parts.first_expiry)
    retries = parts.retries
    out.u8(type(retries) is int)
    if type(retries) is int:
        out.i64(retries)
    else:
        out.array(retries)
    _values(out, parts.sources, out.text)
    return out


def chunks_of(messages: list[Message] | Backlog, size: int = CHUNK) -> list[Chunk]:
    """A queue's messages as chunks in seq order: a ``Backlog``'s as they are."""
    if isinstance(messages, Backlog):
        chunks = list(messages.chunks)
        tail = messages.tail
    else:
        chunks = []
        tail = sorted(messages, key=lambda message: message.seq)
    chunks += [Chunk(tail[start:start + size]) for start in range(0, len(tail), size)]
    return chunks



class SectionReader:
    """A section's payload, read with every length checked against what is left."""

    def __init__(self, data: bytes, swap: bool) -> None:
        self.data = data
        self.at = 0
        self.swap = swap  # the arrays are in the other byte order

    def left(self) -> int:
        return len(self.data) - self.at

    def rest(self) -> bytes:
        """What is left of the section, as it is (a store's own section)."""
        return self.take(self.left())

    def take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.data):
            raise SnapshotError(f"a length ({size}) runs past its section")
        value = self.data[self.at:end]
        self.at = end
        return value

    def _unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack(self.take(fmt.size))[0]

    def u8(self) -> int:
        return self._unpack(_U8)

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def i64(self) -> int:
        return self._unpack(_I64)

    def f64(self) -> float:
        return self._unpack(_F64)

    def blob(self) -> bytes | None:
        size = self.u64()
        return None if size == _NONE_LENGTH else self.take(size)

    def some_blob(self) -> bytes:
        value = self.blob()
        if value is None:
            raise SnapshotError("a value that cannot be absent is")
        return value

    def text(self) -> str | None:
        value = self.blob()
        return None if value is None else value.decode("utf-8", "surrogatepass")

    def opt_f64(self) -> float | None:
        return self.f64() if self.u8() else None

    def count(self) -> int:
        """A number of items that follow: each takes a byte at least."""
        n = self.u32()
        if n > self.left():
            raise SnapshotError(f"a count ({n}) larger than its section")
        return n

    def array(self, typecodes: str, count: int | None = None) -> array[Any]:
        typecode = self.take(1).decode("ascii")
        if typecode not in typecodes:
            raise SnapshotError(f"array type {typecode!r} where {typecodes!r} belongs")
        values = array(typecode)
        values.frombytes(self.some_blob())
        if self.swap:
            values.byteswap()
        if count is not None and len(values) != count:
            raise SnapshotError(f"an array of {len(values)} values for {count} messages")
        return values

    def end(self) -> None:
        if self.left():
            raise SnapshotError(f"{self.left()} bytes left over in a section")


def _read_values(data: SectionReader, count: int, decode: Any) -> Any:
    if not data.u8():
        return decode()
    table = [decode() for _ in range(data.count())]
    index = data.array("I", count)
    if count and max(index) >= len(table):
        raise SnapshotError("a value index past its table")
    return [table[i] for i in index]


def _read_headers(data: SectionReader, count: int) -> Any:
    def decode() -> dict[str, str] | None:
        value = data.blob()
        if value is None:
            return None
        headers = json.loads(value)
        if not isinstance(headers, dict):
            raise SnapshotError("headers that are not an object")
        return headers

    return decode() if not data.u8() else [decode() for _ in range(count)]


def _read_joined(data: SectionReader, count: int) -> tuple[bytes, array[int] | int]:
    joined = data.some_blob()
    if data.u8():
        width = data.u64()
        if not width or width * count != len(joined):
            raise SnapshotError("joined values and their length disagree")
        return joined, width
    ends = data.array("IQ", count)
    if ends[-1] != len(joined):
        raise SnapshotError("joined values and their ends disagree")
    return joined, ends


def read_chunk(data: SectionReader) -> Chunk:
    count = data.u32()
    if not count:
        raise SnapshotError("an empty chunk")
    ids = _read_joined(data, count)
    bodies = _read_joined(data, count)
    queues = _read_values(data, count, data.some_blob)
    seqs = data.array("q")
    if len(seqs) not in (1, count):
        raise SnapshotError(f"{len(seqs)} seqs for {count} messages")
    events = _read_values(data, count, data.blob)
    headers = _read_headers(data, count)
    created = data.array("d", count)
    if data.u8():
        expires, first_expiry = data.array("d", count), data.f64()
    else:
        expires, first_expiry = None, math.inf
    retries = data.i64() if data.u8() else data.array("q", count)
    sources = _read_values(data, count, data.text)
    data.end()
    return Chunk.of_parts(ChunkParts(count, ids, bodies, queues, seqs, events, headers,
                                     created, expires, first_expiry, retries, sources))


def _read_options(data: SectionReader) -> QueueOptions:
    delete_when_unused = data.opt_f64()
    bare = bool(data.u8())
    dead_letter = data.blob()
    has_max = data.u8()
    max_length = data.i64()
    return QueueOptions(delete_when_unused, bare, dead_letter, max_length if has_max else None,
                        data.opt_f64(), data.text())


def read_state(data: SectionReader) -> tuple[Recovered, list[tuple[bytes, list[ChunkEntry]]]]:
    """The state and each queue's chunk entries (``read_entries``), in order."""
    recovered = Recovered(next_seq=data.u64())
    for _ in range(data.count()):
        values = recovered.records.setdefault(data.some_blob(), {})
        for _ in range(data.count()):
            key = data.some_blob()
            values[key] = data.some_blob()
    layout = []
    for _ in range(data.count()):
        name = data.some_blob()
        options = _read_options(data)
        bindings = {data.some_blob() for _ in range(data.count())}
        recovered.queues[name] = RecoveredQueue(name, options, bindings, Backlog())
        layout.append((name, _read_entries(data)))
    data.end()
    return recovered, layout


def _read_entries(data: SectionReader) -> list[ChunkEntry]:
    count = data.u32()
    if count * _ENTRY.size > data.left():
        raise SnapshotError(f"{count} chunks listed, more than the state section holds")
    entries = []
    for _ in range(count):
        entry = ChunkEntry(*_ENTRY.unpack(data.take(_ENTRY.size)))
        if not entry.count or entry.last < entry.first or entry.expires > 1:
            raise SnapshotError("a chunk's entry is malformed")
        entries.append(entry._replace(expires=bool(entry.expires)))
    return entries
