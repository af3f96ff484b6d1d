# -*- test-case-name: tests.unit.test_storage_log -*-
"""The log backend's files, used from its one store thread only (every method is ``*_thd``).

Segments are ``<dir>/<20-digit number>.seg``, numbered consecutively: only
the oldest (head) segment is ever deleted, so a gap in the numbers means a
segment went missing.  ``<dir>/lock`` is held with ``flock`` while a store
has the directory open; the kernel drops it when the process dies, so a
``kill -9`` never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import time
from pathlib import Path
from typing import Any

from mqserver.storage import log_records as records
from mqserver.storage.errors import StoreLockedError

SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")

Data = bytes | mmap.mmap
"""A segment's contents as recovery holds them: mapped (``map_thd``), or a torn
tail's copy cut short (``log_recovery.walk_thd``)."""


def segment_name(number: int) -> str:
    return f"{number:020d}.seg"


class SegmentFiles:
    """Lock file, the active segment's descriptor, reads of sealed segments."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock_fd: int | None = None
        self._active_fd: int | None = None
        self.active: int | None = None
        # file fsyncs and the time they took, for tests and /metrics
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        self.last_fsync_seconds = 0.0

    def path(self, number: int) -> Path:
        return self.directory / segment_name(number)

    # -- lifecycle -----------------------------------------------------------

    def lock_thd(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLockedError(
                    f"{self.directory} is in use by another process (pid {holder}); "
                    "two servers must not share a log directory"
                ) from e
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close_thd(self) -> None:
        """Make everything written durable, then let go of the files and the lock."""
        try:
            if self._active_fd is not None:
                self._fsync(self._active_fd)
                os.close(self._active_fd)
        finally:
            self._active_fd = self.active = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def segments_thd(self) -> list[int]:
        numbers = []
        for entry in os.listdir(self.directory):
            match = SEGMENT_NAME.match(entry)
            if match:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    # -- writing -------------------------------------------------------------

    def start_segment_thd(self, number: int, next_seq: int) -> None:
        """Seal the active segment (fsync) and start ``number`` with its header."""
        if self._active_fd is not None:
            self._fsync(self._active_fd)
            os.close(self._active_fd)
            self._active_fd = None
        fd = os.open(self.path(number), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self._write(fd, records.encode_header(number, next_seq))
            self._fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._active_fd, self.active = fd, number
        self._fsync_dir()

    def append_thd(self, data: bytes, sync: bool) -> None:
        """Write one batch; with ``sync`` it is on disk (one fsync) before this returns."""
        if self._active_fd is None:
            raise OSError("no active log segment")
        self._write(self._active_fd, data)
        if sync:
            self._fsync(self._active_fd)

    def active_size_thd(self) -> int:
        """The active segment's size on disk (-1 without one): where the next batch goes."""
        return -1 if self._active_fd is None else os.fstat(self._active_fd).st_size

    def fsync_thd(self) -> None:
        if self._active_fd is not None:
            self._fsync(self._active_fd)

    def drop_thd(self, number: int) -> None:
        """Delete a dead head segment, after whatever was copied out of it is on disk."""
        self.fsync_thd()
        self.path(number).unlink(missing_ok=True)
        self._fsync_dir()

    def truncate_thd(self, number: int, size: int) -> None:
        with open(self.path(number), "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    def remove_thd(self, number: int) -> None:
        self.path(number).unlink(missing_ok=True)
        self._fsync_dir()

    def _write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def _fsync(self, fd: int) -> None:
        started = time.perf_counter()
        os.fsync(fd)
        self.last_fsync_seconds = time.perf_counter() - started
        self.fsync_seconds += self.last_fsync_seconds
        self.fsyncs += 1

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------

    def map_thd(self, number: int) -> Data:
        """A segment's bytes, mapped rather than read: a restart decodes its live
        messages from it later, one chunk at a time, and reading 64 MiB
        segments whole was 0.1 s of a 1M-message start (and reading the active
        one, to walk the little after a checkpoint, 30 ms).  Only for segments
        nothing truncates below the length mapped: sealed ones (compaction
        deletes them whole, which leaves a mapping valid) and the active one,
        which the store only appends to after its recovery; a mapping covers
        the length it was made with, so appends do not touch it.  The
        recovery cuts a torn tail off a copy (``log_recovery.walk_thd``)."""
        with open(self.path(number), "rb") as f:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                return b""

    def read_records_thd(
        self, number: int, spans: list[tuple[int, int]]
    ) -> list[tuple[int, int, int, Any, bytes]]:
        """The records at ``spans`` ((offset, frame size), from the index), as ``scan_thd``
        gives them; a frame that does not check there is an index bug: raise."""
        found: list[tuple[int, int, int, Any, bytes]] = []
        with open(self.path(number), "rb") as f:
            fd = f.fileno()
            for offset, size in spans:
                data = os.pread(fd, size, offset)
                frames = list(records.iter_frames(data, 0, len(data)))
                if len(frames) != 1 or frames[0][2] is None or frames[0][1] != size:
                    raise RuntimeError(f"segment {number}: no record of {size} bytes at {offset}")
                payload = frames[0][2]
                found.append((offset, size, payload[0], records.record_key(payload), payload))
        return found

    def scan_thd(
        self, number: int, offset: int, budget: int
    ) -> tuple[list[tuple[int, int, int, Any, bytes]], int, int]:
        """Kept records of a sealed segment from ``offset``, about ``budget`` bytes of them.

        Returns ([(offset, frame size, kind, key, payload)], next offset, file
        size).  Parsing happens here, not on the reactor, which then only
        checks each key against the index.
        """
        found: list[tuple[int, int, int, Any, bytes]] = []
        with open(self.path(number), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset >= size:
                return found, size, size
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                stop = offset + budget
                pos = offset
                for pos, frame_size, payload in records.iter_frames(buf, offset, size):
                    if payload is not None and payload[0] in records.KEPT_KINDS:
                        found.append(
                            (pos, frame_size, payload[0], records.record_key(payload), payload)
                        )
                    if pos + abs(frame_size) >= stop:
                        return found, pos + abs(frame_size), size
        return found, size, size
