# -*- test-case-name: tests.unit.test_snapshot_chunks -*-
"""Chunks of a clean-shutdown snapshot read when they are needed, not at the start.

A restart with a million ready messages would otherwise read and checksum
the whole snapshot (115-139 MB) before it serves anything.  The snapshot's
state section lists every chunk's place, checksum, count and seqs
(``snapshot_sections.ChunkEntry``), checked at the open; a ``LazyChunk``
stands for one chunk with just that, so the broker counts, orders and
accepts from the first moment, and its bytes are read later:

- ``check`` reads the chunk's section (``os.pread`` on the open file: a read
  error is an ``OSError``, never the ``SIGBUS`` a mapped page would raise)
  and verifies its checksum; a sound section's bytes are kept.  Thread-safe:
  the broker's service checks every chunk in a thread once it listens
  (``packed.check_thd``), and a queue checks the chunk a delivery reaches
  (``PackedReady._settle_front``), or what is left before any other read
  (``PackedReady.settle``).
- The first read of a content attribute (``unpack``, ``message``, ``parts``
  ...) parses the kept bytes into the ``Chunk``'s own slots; from then on
  the chunk is an ordinary one.  Only a checked chunk is ever parsed by the
  broker, so a damaged one is found where it can be set aside cleanly
  (``Broker.withhold``), never halfway through a dispatch.

Only chunks without TTLs are read this way: the broker's expiry heap needs
every expiry time at the load, so a chunk holding one is read at the open.
The file is unlinked once the store's open fired (``discard_after_open``);
its descriptor keeps it readable until the last chunk let go of it.
"""

from __future__ import annotations

import os
import threading
import weakref
import zlib
from pathlib import Path

from mqserver.packed import Chunk
from mqserver.storage.pending_chunk import PendingChunk
from mqserver.storage.snapshot_sections import (
    ChunkEntry,
    SectionReader,
    SnapshotError,
    read_chunk,
)

_SECTION_HEAD = 12  # u64 length | u32 crc32, before each section's payload


class SnapshotFile:
    """The open snapshot: its descriptor, closed once nothing refers to this."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self.fd)
        self.lock = threading.Lock()  # a chunk's state changes under it
        self.swap = False  # the arrays are in the other byte order (the header's flags)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise OSError(f"{size} bytes at {offset}: the file ends after {len(data)}")
        return data


class LazyChunk(PendingChunk):
    """A chunk whose columns are still in the snapshot file (module docstring)."""

    __slots__ = ("_crc", "_file", "_length", "_offset", "_raw", "_swap")

    origin = "clean-shutdown snapshot"

    def __init__(self, file: SnapshotFile, offset: int, length: int, crc: int, count: int,
                 first: int, last: int, queue: bytes) -> None:
        super().__init__(queue, count, first, last)
        self._file: SnapshotFile | None = file  # until the chunk is known sound
        self._swap = file.swap
        self._offset, self._length, self._crc = offset, length, crc
        self._raw: bytes | None = None  # the checked payload, until it is parsed

    def check(self) -> str | None:
        """None if the chunk's bytes are sound (read and kept), else why not.

        A sound chunk lets go of the file: its descriptor is closed (and the
        unlinked file's space freed) once every chunk was checked."""
        file = self._file  # before ``_sound``: it is let go of only after that is set
        if self._sound is None:
            assert file is not None
            raw, problem = _read_section(file, self._offset, self._length, self._crc)
            with file.lock:
                if self._sound is None:
                    self._raw, self._problem = raw, problem
                    self._sound = raw is not None
                    if raw is not None:
                        self._file = None
        return None if self._sound else self._problem

    def kept_section(self) -> tuple[bytes, ChunkEntry] | None:
        """The chunk's section as it was read and its entry, if it is sound and not
        parsed yet: the next snapshot writes it as it is (no parse, no encoding, no
        checksum again: a restart and a stop with a backlog nobody read)."""
        raw = self._raw if self.check() is None else None
        if raw is None:
            return None
        return raw, ChunkEntry(self._length, self._crc, self._count, self._first, self._last,
                               False)

    def _where(self) -> str:
        return str(self._file.path) if self._file else "the snapshot"

    def _columns(self) -> Chunk:
        return self.parsed(expires=False)

    def parsed(self, expires: bool) -> Chunk:
        """The chunk's columns as an ordinary ``Chunk`` (checked first); ``expires``:
        whether the state says some message has a TTL.  Only a section that
        passed its checksum yet does not match the state raises here."""
        problem = self.check()
        if problem is not None:
            raise SnapshotError(f"{self.describe()}: {problem}")
        # sound: no thread changes ``_raw`` any more
        raw, self._raw = self._raw, None
        assert raw is not None
        section = SectionReader(raw, self._swap)
        section.at = _SECTION_HEAD
        chunk = read_chunk(section)
        seqs = chunk.seq_column()
        if chunk.count != self._count or (seqs[0], seqs[-1]) != (self._first, self._last) \
                or (chunk.expires is not None) != expires:
            raise SnapshotError(f"{self.describe()}: the chunk and the state disagree")
        return chunk


def _read_section(file: SnapshotFile, offset: int, length: int,
                  crc: int) -> tuple[bytes | None, str]:
    """(the section, its head included, "") if it is as the state says, else
    (None, why not)."""
    try:
        data = file.read(offset, _SECTION_HEAD + length)
    except OSError as e:
        return None, f"cannot be read ({e})"
    if int.from_bytes(data[:8], "little") != length:
        return None, "its section's length is not the one the state gives"
    with memoryview(data) as view:
        found = zlib.crc32(view[_SECTION_HEAD:])
    if found != crc or int.from_bytes(data[8:12], "little") != crc:
        return None, "it fails its checksum"
    return data, ""


__all__ = ["LazyChunk", "SnapshotFile"]
