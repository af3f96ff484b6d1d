# -*- test-case-name: tests.unit.test_snapshot -*-
"""The clean-shutdown snapshot: the broker's durable state as one file of packed chunks.

A clean stop (SIGTERM) writes it once the broker's writer has flushed every
op, so it holds exactly what the store holds; the next start reads it
instead of replaying the store, when the store confirms that nothing
changed since (docs/storage.md, "The clean-shutdown snapshot").  As RabbitMQ
keeps its "clean shutdown" recovery terms, and Redis saves at shutdown.

Pure functions, no pickle (a file in the data directory must never run
code): integers and floats through ``struct``, ids and bodies as one joined
``bytes`` plus an array of end offsets, every number column as an array
(``array.tobytes``), so reading a million messages makes a thousand
``Chunk``\\ s and no ``Message``.  Layout (integers little-endian; arrays in
the byte order the header names)::

    header, 40 bytes: b"MQSRVSNP" | u16 version | u16 flags (1: big-endian
        arrays) | u32 sections | u64 token | u64 body bytes | u32 crc32 of
        the header before it
    body: sections, each u64 length | u32 crc32(payload) | payload:
        1. the store's own section, opaque here: what the store checks its
           files against (and the log's index), read first;
        2. the state: next_seq, records, and each queue's name, options,
           bindings and number of chunks;
        3. each queue's chunks in seq order, one section each.

Reading checks the header, each section's length against what is left of
the file and its checksum before parsing it, and every count and length
inside against the section: a truncated, corrupt or foreign file raises
``SnapshotError`` (the store then replays), and nothing allocates more than
the file holds.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mqserver.model import Message, QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import CHUNK, Backlog, Chunk, share_recovered_values

FILENAME = "mqserver.snapshot"
VERSION = 1
MAGIC = b"MQSRVSNP"
_HEADER = struct.Struct("<8sHHIQQ")
HEADER_SIZE = _HEADER.size + 4
_SECTION = struct.Struct("<QI")
_BIG_ENDIAN = 1
_FLAGS = _BIG_ENDIAN if sys.byteorder == "big" else 0

_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_I64, _F64 = struct.Struct("<q"), struct.Struct("<d")
_NONE_LENGTH = (1 << 64) - 1  # the length of an absent optional value


class SnapshotError(Exception):
    """The snapshot cannot be used: missing, stale, truncated, corrupt or foreign."""


@dataclass
class Snapshot:
    """What ``read`` gives: the store's token, the state, the store's own section."""

    token: int
    recovered: Recovered
    extra: Any  # what the store's ``accept`` made of its section


# -- writing --------------------------------------------------------------------


class SectionWriter:
    """One section's payload as parts (bodies are written as they are, never copied)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

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

    def blob(self, value: bytes | None) -> None:
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
        self.blob(values.tobytes())


def _state_section(recovered: Recovered, chunks: dict[bytes, list[Chunk]]) -> SectionWriter:
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
        out.u64(len(chunks[name]))
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


def _chunk_section(chunk: Chunk) -> SectionWriter:
    out = SectionWriter()
    out.u32(chunk.count)
    _joined(out, chunk.ids)
    _joined(out, chunk.bodies)
    _values(out, chunk.queues, out.blob)
    out.array(chunk.seqs)  # every seq, or the first alone when consecutive
    _values(out, chunk.events, out.blob)
    _headers(out, chunk.headers)
    out.array(chunk.created)
    out.u8(chunk.expires is not None)
    if chunk.expires is not None:
        out.array(chunk.expires)
        out.f64(chunk.first_expiry)
    retries = chunk.retries
    out.u8(type(retries) is int)
    if type(retries) is int:
        out.i64(retries)
    else:
        out.array(retries)
    _values(out, chunk.sources, out.text)
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


def write(path: Path, recovered: Recovered, token: int, extra: bytes = b"") -> int:
    """Write the snapshot atomically (a temporary file, fsync, rename, fsync of the
    directory); returns its size.  Runs in a store's thread: it blocks."""
    chunks = {name: chunks_of(rq.messages) for name, rq in recovered.queues.items()}
    sections: Iterator[SectionWriter] = _sections(recovered, chunks, extra)
    count = 2 + sum(map(len, chunks.values()))
    tmp = path.with_name(path.name + ".tmp")
    size = HEADER_SIZE
    with open(tmp, "wb") as f:
        f.write(bytes(HEADER_SIZE))
        for out in sections:
            size += _write_section(f, out.parts)
        header = _HEADER.pack(MAGIC, VERSION, _FLAGS, count, token, size - HEADER_SIZE)
        f.seek(0)
        f.write(header + _U32.pack(zlib.crc32(header)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return size


def _sections(recovered: Recovered, chunks: dict[bytes, list[Chunk]],
              extra: bytes) -> Iterator[SectionWriter]:
    out = SectionWriter()
    out.parts.append(extra)
    yield out
    yield _state_section(recovered, chunks)
    for name in recovered.queues:
        for chunk in chunks[name]:
            yield _chunk_section(chunk)


def _write_section(f: BinaryIO, parts: list[bytes]) -> int:
    crc = length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    f.write(_SECTION.pack(length, crc))
    for part in parts:
        f.write(part)
    return _SECTION.size + length


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(path: Path) -> bool:
    """Remove the snapshot (and a temporary file a crash left) durably; True if there was one."""
    tmp = path.with_name(path.name + ".tmp")
    found = path.exists()
    if found or tmp.exists():
        path.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        fsync_directory(path.parent)
    return found


# -- reading --------------------------------------------------------------------


class SectionReader:
    """A section's payload, read with every length checked against what is left."""

    def __init__(self, data: bytes, swap: bool) -> None:
        self.data = data
        self.at = 0
        self.swap = swap  # the arrays are in the other byte order

    def left(self) -> int:
        return len(self.data) - self.at

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


class _StreamedSection(SectionReader):
    """A chunk's section read from the file as it is parsed, so each body is
    copied once; its checksum is checked at its end (every length is still
    checked against what is left of it first, so damage found only by the
    checksum cannot make a read go astray)."""

    def __init__(self, f: BinaryIO, length: int, crc: int, swap: bool) -> None:
        super().__init__(b"", swap)
        self.f = f
        self.remaining = length
        self.crc = 0
        self.expected = crc

    def left(self) -> int:
        return self.remaining

    def take(self, size: int) -> bytes:
        if size < 0 or size > self.remaining:
            raise SnapshotError(f"a length ({size}) runs past its section")
        value = self.f.read(size)
        if len(value) != size:
            raise SnapshotError("truncated: a section is cut off")
        self.remaining -= size
        self.crc = zlib.crc32(value, self.crc)
        return value

    def end(self) -> None:
        super().end()
        if self.crc != self.expected:
            raise SnapshotError("a section fails its checksum")


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


def _read_chunk(data: SectionReader) -> Chunk:
    chunk = Chunk.__new__(Chunk)
    count = chunk.count = data.u32()
    if not count:
        raise SnapshotError("an empty chunk")
    chunk.ids = _read_joined(data, count)
    chunk.bodies = _read_joined(data, count)
    chunk.queues = _read_values(data, count, data.some_blob)
    chunk.seqs = data.array("q")
    if len(chunk.seqs) not in (1, count):
        raise SnapshotError(f"{len(chunk.seqs)} seqs for {count} messages")
    chunk.events = _read_values(data, count, data.blob)
    chunk.headers = _read_headers(data, count)
    chunk.created = data.array("d", count)
    if data.u8():
        chunk.expires = data.array("d", count)
        chunk.first_expiry = data.f64()
    else:
        chunk.expires, chunk.first_expiry = None, math.inf
    chunk.retries = data.i64() if data.u8() else data.array("q", count)
    chunk.sources = _read_values(data, count, data.text)
    data.end()
    return chunk


def _read_options(data: SectionReader) -> QueueOptions:
    delete_when_unused = data.opt_f64()
    bare = bool(data.u8())
    dead_letter = data.blob()
    has_max = data.u8()
    max_length = data.i64()
    return QueueOptions(delete_when_unused, bare, dead_letter, max_length if has_max else None,
                        data.opt_f64(), data.text())


def _read_state(data: SectionReader) -> tuple[Recovered, list[tuple[bytes, int]]]:
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
        layout.append((name, data.u64()))
    data.end()
    return recovered, layout


class _File:
    """Sections of an open snapshot, each checked before it is parsed."""

    def __init__(self, f: BinaryIO, left: int, flags: int) -> None:
        self.f = f
        self.left = left
        self.swap = flags != _FLAGS

    def section(self, streamed: bool = False) -> SectionReader:
        head = self.f.read(_SECTION.size)
        if len(head) != _SECTION.size:
            raise SnapshotError("truncated: a section header is cut off")
        length, crc = _SECTION.unpack(head)
        self.left -= _SECTION.size
        if length > self.left:
            raise SnapshotError(f"truncated: a section of {length} bytes, {self.left} left")
        if streamed:
            self.left -= length
            return _StreamedSection(self.f, length, crc, self.swap)
        payload = self.f.read(length)
        self.left -= length
        if len(payload) != length:
            raise SnapshotError("truncated: a section is cut off")
        if zlib.crc32(payload) != crc:
            raise SnapshotError("a section fails its checksum")
        return SectionReader(payload, self.swap)


def read_header(f: BinaryIO) -> tuple[int, int, int, int]:
    """(flags, sections, token, body bytes) of an open snapshot; SnapshotError if it is none."""
    data = f.read(HEADER_SIZE)
    if len(data) != HEADER_SIZE:
        raise SnapshotError("truncated: no complete header")
    magic, version, flags, sections, token, body = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError("not an mqserver snapshot")
    if _U32.unpack_from(data, _HEADER.size)[0] != zlib.crc32(data[:_HEADER.size]):
        raise SnapshotError("the header fails its checksum")
    if version != VERSION:
        raise SnapshotError(f"format version {version}; this mqserver reads {VERSION}")
    if flags & ~_BIG_ENDIAN:
        raise SnapshotError(f"unknown flags {flags:#x}")
    return flags, sections, token, body


def read(path: Path, token: int | None = None,
         accept: Callable[[SectionReader], Any] | None = None) -> Snapshot:
    """The snapshot at ``path``; with ``token``, only if it is the one the store
    marked.  ``accept`` gets the store's section, first: it raises
    ``SnapshotError`` if the store's files changed since, and what it returns
    is the ``Snapshot``'s ``extra``; the messages are read only then.  Raises
    ``SnapshotError`` (or ``OSError``) when the snapshot cannot be used."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        flags, sections, found, body = read_header(f)
        if token is not None and found != token:
            raise SnapshotError("stale: the store was not closed with this snapshot")
        if body != size - HEADER_SIZE:
            raise SnapshotError(f"truncated or extended: {size - HEADER_SIZE} body bytes, "
                                f"the header says {body}")
        try:
            return _read_body(_File(f, body, flags), sections, found, accept)
        except (struct.error, ValueError, OverflowError, UnicodeDecodeError,
                RecursionError) as e:
            raise SnapshotError(f"malformed: {e}") from e


def _read_body(f: _File, sections: int, token: int,
               accept: Callable[[SectionReader], Any] | None) -> Snapshot:
    section = f.section()
    extra = section.data if accept is None else accept(section)
    recovered, layout = _read_state(f.section())
    if sum(chunks for _, chunks in layout) != sections - 2:
        raise SnapshotError("the header and the state disagree on the number of sections")
    for name, chunks in layout:
        backlog = recovered.queues[name].messages
        assert isinstance(backlog, Backlog)
        for _ in range(chunks):
            backlog.append_chunk(_read_chunk(f.section(streamed=True)))
    if f.left:
        raise SnapshotError(f"{f.left} bytes after the last section")
    share_recovered_values(recovered.queues.values())
    return Snapshot(token, recovered, extra)


def new_token() -> int:
    """A token a store marks itself with at a clean close: random, and never 0."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1


def message_count(recovered: Recovered) -> int:
    return sum(len(rq.messages) for rq in recovered.queues.values())


__all__ = ["FILENAME", "Snapshot", "SnapshotError", "chunks_of", "discard", "message_count",
           "new_token", "read", "write"]

