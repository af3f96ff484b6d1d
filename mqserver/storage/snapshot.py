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
the file, its checksum (at its end: a section is parsed as it is read, so
each body is copied once), and every count and length inside against what
is left of the section (``snapshot_sections``): a truncated,
corrupt or foreign file raises ``SnapshotError`` (the store then replays),
and nothing allocates more than the file holds.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mqserver.model import Recovered
from mqserver.packed import Backlog, Chunk, share_recovered_values
from mqserver.storage.snapshot_sections import (
    SectionReader,
    SectionWriter,
    SnapshotError,
    StreamedSection,
    chunk_section,
    chunks_of,
    read_chunk,
    read_state,
    state_section,
)

FILENAME = "mqserver.snapshot"
VERSION = 1
MAGIC = b"MQSRVSNP"
_HEADER = struct.Struct("<8sHHIQQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size
_SECTION = struct.Struct("<QI")
_BIG_ENDIAN = 1
_FLAGS = _BIG_ENDIAN if sys.byteorder == "big" else 0


@dataclass
class Snapshot:
    """What ``read`` gives: the store's token, the state, the store's own section."""

    token: int
    recovered: Recovered
    extra: Any  # what the store's ``accept`` made of its section



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
        f.write(header + _CRC.pack(zlib.crc32(header)))
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
    yield state_section(recovered, chunks)
    for name in recovered.queues:
        for chunk in chunks[name]:
            yield chunk_section(chunk)


def _write_section(f: BinaryIO, parts: list[bytes | memoryview]) -> int:
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


def discard_after_open(path: Path) -> str | None:
    """``discard``, as a store runs it in its thread once its open fired: None, or
    why the file stays (a line to log).

    Not before: unlinking 100 MB takes tens of milliseconds, and the store's
    open has made the snapshot unusable already (the mark cleared, the files
    changed); the file is only tidied away.
    """
    try:
        discard(path)
    except OSError as e:
        return f"clean-shutdown snapshot {path} not removed ({e}); it is never used again"
    return None



class _File:
    """Sections of an open snapshot, each checked before it is parsed."""

    def __init__(self, f: BinaryIO, left: int, flags: int) -> None:
        self.f = f
        self.left = left
        self.swap = flags != _FLAGS

    def section(self) -> SectionReader:
        """The next section, read as it is parsed (each value copied once); its
        checksum is checked by its reader's ``end``."""
        head = self.f.read(_SECTION.size)
        if len(head) != _SECTION.size:
            raise SnapshotError("truncated: a section header is cut off")
        length, crc = _SECTION.unpack(head)
        self.left -= _SECTION.size
        if length > self.left:
            raise SnapshotError(f"truncated: a section of {length} bytes, {self.left} left")
        self.left -= length
        return StreamedSection(self.f, length, crc, self.swap)


def read_header(f: BinaryIO) -> tuple[int, int, int, int]:
    """(flags, sections, token, body bytes) of an open snapshot; SnapshotError if it is none."""
    data = f.read(HEADER_SIZE)
    if len(data) != HEADER_SIZE:
        raise SnapshotError("truncated: no complete header")
    magic, version, flags, sections, token, body = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError("not an mqserver snapshot")
    if _CRC.unpack_from(data, _HEADER.size)[0] != zlib.crc32(data[:_HEADER.size]):
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
    extra = section.rest() if accept is None else accept(section)
    section.end()
    recovered, layout = read_state(f.section())
    if sum(chunks for _, chunks in layout) != sections - 2:
        raise SnapshotError("the header and the state disagree on the number of sections")
    for name, chunks in layout:
        backlog = recovered.queues[name].messages
        assert isinstance(backlog, Backlog)
        for _ in range(chunks):
            backlog.append_chunk(read_chunk(f.section()))
    if f.left:
        raise SnapshotError(f"{f.left} bytes after the last section")
    share_recovered_values(recovered.queues.values())
    return Snapshot(token, recovered, extra)


def new_token() -> int:
    """A token a store marks itself with at a clean close: random, and never 0."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1


def message_count(recovered: Recovered) -> int:
    return sum(len(rq.messages) for rq in recovered.queues.values())


__all__ = ["FILENAME", "SectionReader", "SectionWriter", "Snapshot", "SnapshotError", "chunks_of",
           "discard", "discard_after_open", "message_count", "new_token", "read", "write"]
