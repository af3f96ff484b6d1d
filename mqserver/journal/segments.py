"""Segment files: write encoded batches, roll on size/time/date, seal by atomic rename.

Used by the journal process (``python -m mqserver.journal.sink``) and, in
tests, in-process.  Readers (Spark) only ever see sealed, complete
``*.jsonl`` files; ``*.jsonl.open`` is the one being written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import IO, Any

from mqserver.journal.encode import Encoder
from mqserver.journal.schema import (
    DATE_DIR,
    OPEN_SUFFIX,
    SEALED_SUFFIX,
    parse_segment_name,
    segment_name,
)


def safe_node(name: str) -> str:
    """A node name usable in file names (host names usually are already)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "node"


class SegmentWriter:
    """Appends batches to the open segment of ``directory``; ``now`` gives seconds."""

    def __init__(
        self,
        directory: str,
        node: str,
        now: Callable[[], float],
        bodies: bool = False,
        segment_bytes: int = 64 * 1024 * 1024,
        segment_seconds: float = 300.0,
    ) -> None:
        self.directory = directory
        self.node = safe_node(node)
        self.now = now
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        os.makedirs(directory, exist_ok=True)
        self.recovered: list[str] = []
        self.encoder = Encoder(self.node, bodies, self._recover())
        self._file: IO[str] | None = None
        self._path = ""
        self._date = ""
        self._size = 0
        self._opened_at = 0.0
        self.records_written = 0

    def _recover(self) -> int:
        """Seal segments a crash left open; return the seq to continue from.

        A torn last line stays as it is (its seq is spent): the reader counts
        and skips malformed lines.
        """
        next_seq = 1
        for date_dir in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, date_dir)
            if not date_dir.startswith(DATE_DIR) or not os.path.isdir(path):
                continue
            for name in os.listdir(path):
                parsed = parse_segment_name(name)
                if parsed is None or parsed[0] != self.node:
                    continue
                full = os.path.join(path, name)
                if name.endswith(OPEN_SUFFIX):
                    sealed = full[: -len(OPEN_SUFFIX)] + SEALED_SUFFIX
                    os.replace(full, sealed)
                    full = sealed
                    self.recovered.append(sealed)
                if parsed[1] >= next_seq:
                    next_seq = max(next_seq, parsed[1] + _count_lines(full))
        return next_seq

    def write(self, values: list[Any]) -> None:
        """Encode and append a batch (flat, see ``mqserver.journal.encode``),
        then seal the segment if it is due."""
        for date, text, first_seq, count in self.encoder.encode(values):
            if self._file is not None and date != self._date:
                self.seal()
            if self._file is None:
                self._open(date, first_seq)
            assert self._file is not None
            self._file.write(text)
            self._size += len(text)
            self.records_written += count
        if self._file is not None:
            self._file.flush()
        self.seal_if_due()

    def seal_if_due(self) -> None:
        if self._file is not None and (
            self._size >= self.segment_bytes
            or self.now() - self._opened_at >= self.segment_seconds
        ):
            self.seal()

    def _open(self, date: str, first_seq: int) -> None:
        folder = os.path.join(self.directory, DATE_DIR + date)
        os.makedirs(folder, exist_ok=True)
        sealed = segment_name(self.node, first_seq)
        self._path = os.path.join(folder, sealed[: -len(SEALED_SUFFIX)] + OPEN_SUFFIX)
        self._file = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        self._date = date
        self._size = 0
        self._opened_at = self.now()

    def seal(self) -> None:
        """Close the open segment and rename it to ``.jsonl``, atomically."""
        if self._file is None:
            return
        self._file.close()
        self._file = None
        os.replace(self._path, self._path[: -len(OPEN_SUFFIX)] + SEALED_SUFFIX)


def _count_lines(path: str) -> int:
    """Records in a segment (a torn last line counts: its seq was spent)."""
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
