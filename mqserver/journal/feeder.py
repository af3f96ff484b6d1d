# -*- test-case-name: tests.unit.test_journal_feeder -*-
"""Hands journal batches to the journal process from a thread of their own.

Profiles of W1 with the journal on showed the broker spending more time in
the pipe's ``write`` calls (Twisted writes a 64 KiB pipe in many small
pieces as the reader drains it) than in building the records.  Here one
daemon thread marshals each batch and writes it with blocking ``os.write``
calls, which release the GIL, into a pipe enlarged to 1 MiB where Linux
allows: the reactor only swaps a list and puts it on a queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from mqserver.journal.sink import frame

PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class Feeder:
    """Writes framed batches to ``fd`` in order, then closes it after ``close()``.

    ``on_error(exc, lost)`` is called from the feeder thread when a write
    fails (the journal process is gone); from then on batches are counted
    as lost, never written.  ``lost`` is the number of values dropped.
    """

    def __init__(self, fd: int, on_error: Callable[[BaseException, int], None]) -> None:
        self.fd = fd
        self.on_error = on_error
        self.failed = False
        # not a pipe, or above /proc/sys/fs/pipe-max-size: the default will do
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
        self._batches: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="journal-feeder", daemon=True)
        self._thread.start()

    def send(self, values: list[Any]) -> None:
        """Queue one batch; the caller must not touch ``values`` afterwards."""
        self._batches.put(values)

    def close(self) -> None:
        """Write what is queued, then close the pipe: the journal process sees its end."""
        self._batches.put(None)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while (values := self._batches.get()) is not None:
                if self.failed:
                    continue
                try:
                    self._write_all(frame(values))
                except OSError as e:
                    self.failed = True
                    self.on_error(e, len(values))
        finally:
            os.close(self.fd)

    def _write_all(self, parts: list[bytes]) -> None:
        views = [memoryview(part) for part in parts]
        while views:
            written = os.writev(self.fd, views)
            while views and written >= len(views[0]):
                written -= len(views.pop(0))
            if written:
                views[0] = views[0][written:]
