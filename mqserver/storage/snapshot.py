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

    header, 48 bytes: b"MQSRVSNP" | u16 version | u16 flags (1: big-endian
        arrays) | u32 sections | u64 token | u64 body bytes | u64 where the
        state section starts | u32 crc32 of the header before it
    body: sections, each u64 length | u32 crc32(payload) | payload:
        1. the store's own section, opaque here: what the store checks its
           files against (and the log's index), read first;
        2. each queue's chunks in seq order, one section each;
        3. the state, last: next_seq, records, and each queue's name,
           options, bindings and chunks (each one's section length, crc32,
           count, first and last seq, and whether it holds a TTL).

Reading checks the header, the store's section and the state (each
section's length against the file, its checksum before it is parsed, and
every count and length inside against what is left of the section:
``snapshot_sections``), and that the chunks listed fill the file between
them: a truncated, corrupt or foreign file raises ``SnapshotError`` (the
store then replays), and nothing allocates more than the file holds.  The
chunks themselves are read when needed (``snapshot_chunks``): a damaged
one is found by its check, after the start.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mqserver.model import Recovered
from mqserver.packed import Backlog, Chunk, share_recovered_values
from mqserver.storage.snapshot_chunks import LazyChunk, SnapshotFile
from mqserver.storage.snapshot_sections import (
    ChunkEntry,
    SectionReader,
    SectionWriter,
    SnapshotError,
    chunk_section,
    chunks_of,
    entry_of,
    read_state,
    state_section,
)

FILENAME = "mqserver.snapshot"
VERSION = 2
MAGIC = b"MQSRVSNP"
_HEADER = struct.Struct("<8sHHIQQQ")
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
    entries: dict[bytes, list[ChunkEntry]] = {}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(bytes(HEADER_SIZE))
        size = HEADER_SIZE + _write_section(f, [extra])[0]
        for name, queue_chunks in chunks.items():
            listed = entries[name] = []
            for chunk in queue_chunks:
                kept = chunk.kept_section() if isinstance(chunk, LazyChunk) else None
                if kept is None:
                    length, crc = _write_section(f, chunk_section(chunk).parts)
                    listed.append(entry_of(chunk, length - _SECTION.size, crc))
                else:  # read from the last snapshot, checked, never parsed
                    section, entry = kept
                    f.write(section)
                    length = len(section)
                    listed.append(entry)
                size += length
        state_at = size
        size += _write_section(f, state_section(recovered, entries).parts)[0]
        count = 2 + sum(map(len, chunks.values()))
        header = _HEADER.pack(MAGIC, VERSION, _FLAGS, count, token, size - HEADER_SIZE,
                              state_at)
        f.seek(0)
        f.write(header + _CRC.pack(zlib.crc32(header)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return size


def _write_section(f: BinaryIO, parts: list[bytes | memoryview]) -> tuple[int, int]:
    """(bytes written, the payload's crc32)."""
    crc = length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    f.write(_SECTION.pack(length, crc))
    for part in parts:
        f.write(part)
    return _SECTION.size + length, crc


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



def read_header(data: bytes) -> tuple[int, int, int, int, int]:
    """(flags, sections, token, body bytes, state at) of a snapshot's first
    ``HEADER_SIZE`` bytes; SnapshotError if they are none."""
    if len(data) != HEADER_SIZE:
        raise SnapshotError("truncated: no complete header")
    magic, version, flags, sections, token, body, state_at = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError("not an mqserver snapshot")
    if _CRC.unpack_from(data, _HEADER.size)[0] != zlib.crc32(data[:_HEADER.size]):
        raise SnapshotError("the header fails its checksum")
    if version != VERSION:
        raise SnapshotError(f"format version {version}; this mqserver reads {VERSION}")
    if flags & ~_BIG_ENDIAN:
        raise SnapshotError(f"unknown flags {flags:#x}")
    return flags, sections, token, body, state_at


def read(path: Path, token: int | None = None,
         accept: Callable[[SectionReader], Any] | None = None) -> Snapshot:
    """The snapshot at ``path``; with ``token``, only if it is the one the store
    marked.  ``accept`` gets the store's section, first: it raises
    ``SnapshotError`` if the store's files changed since, and what it returns
    is the ``Snapshot``'s ``extra``; the state is read only then.  Raises
    ``SnapshotError`` (or ``OSError``) when the snapshot cannot be used.

    The chunks without TTLs are ``LazyChunk``\\ s, read and checked when
    needed (``snapshot_chunks``): a damaged one is found then, not here."""
    file = SnapshotFile(path)
    size = file.size()
    flags, sections, found, body, state_at = read_header(file.read(0, min(size, HEADER_SIZE)))
    if token is not None and found != token:
        raise SnapshotError("stale: the store was not closed with this snapshot")
    if body != size - HEADER_SIZE:
        raise SnapshotError(f"truncated or extended: {size - HEADER_SIZE} body bytes, "
                            f"the header says {body}")
    file.swap = flags != _FLAGS
    try:
        return _read_body(file, sections, found, state_at, accept)
    except (struct.error, ValueError, OverflowError, UnicodeDecodeError,
            RecursionError) as e:
        raise SnapshotError(f"malformed: {e}") from e


def _section(file: SnapshotFile, offset: int, end: int) -> tuple[SectionReader, int]:
    """The checked section at ``offset`` (it must end by ``end``), and where it ends."""
    if offset + _SECTION.size > end:
        raise SnapshotError("truncated: a section header is cut off")
    length, crc = _SECTION.unpack(file.read(offset, _SECTION.size))
    start = offset + _SECTION.size
    if length > end - start:
        raise SnapshotError(f"truncated: a section of {length} bytes, {end - start} left")
    payload = file.read(start, length)
    if zlib.crc32(payload) != crc:
        raise SnapshotError("a section fails its checksum")
    return SectionReader(payload, file.swap), start + length


def _read_body(file: SnapshotFile, sections: int, token: int, state_at: int,
               accept: Callable[[SectionReader], Any] | None) -> Snapshot:
    size = file.size()
    if not HEADER_SIZE < state_at < size:
        raise SnapshotError(f"the state's place ({state_at}) is outside the file")
    section, at = _section(file, HEADER_SIZE, state_at)
    extra = section.rest() if accept is None else accept(section)
    section.end()
    state, end = _section(file, state_at, size)
    if end != size:
        raise SnapshotError(f"{size - end} bytes after the last section")
    recovered, layout = read_state(state)
    if sum(len(entries) for _, entries in layout) != sections - 2:
        raise SnapshotError("the header and the state disagree on the number of sections")
    for name, entries in layout:
        backlog = recovered.queues[name].messages
        assert isinstance(backlog, Backlog)
        for entry in entries:
            if entry.length > state_at - at - _SECTION.size:
                raise SnapshotError("the chunks listed run past the state")
            backlog.append_chunk(_chunk(file, at, entry, name))
            at += _SECTION.size + entry.length
    if at != state_at:
        raise SnapshotError(f"the chunks listed end at {at}, the state starts at {state_at}")
    share_recovered_values(recovered.queues.values())
    return Snapshot(token, recovered, extra)


def _chunk(file: SnapshotFile, at: int, entry: ChunkEntry, queue: bytes) -> Chunk:
    """The chunk ``entry`` lists: read now if it holds TTLs, else read when needed."""
    chunk = LazyChunk(file, at, entry.length, entry.crc, entry.count, entry.first, entry.last,
                        queue)
    if entry.expires:  # the broker's expiry heap needs its times at the load
        return chunk.parsed(expires=True)
    return chunk


def new_token() -> int:
    """A token a store marks itself with at a clean close: random, and never 0."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1


def message_count(recovered: Recovered) -> int:
    return sum(len(rq.messages) for rq in recovered.queues.values())


__all__ = ["FILENAME", "SectionReader", "SectionWriter", "Snapshot", "SnapshotError", "chunks_of",
           "discard", "discard_after_open", "message_count", "new_token", "read", "write"]
