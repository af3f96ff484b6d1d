# -*- test-case-name: tests.unit.test_storage_sqlite -*-
"""SQLite's side of the clean-shutdown snapshot: its mark, and the check that the
database is as the clean close left it (runs in the store's thread).

**The mark.**  The last transaction of a clean close stores a random token in
``meta`` (``key = 'snapshot'``); the WAL is then checkpointed and the file
closed, and the snapshot is written with the token and the closed files'
fingerprint: the database file's size, mtime and inode, and the WAL's size.
A crash before the snapshot's rename leaves a mark and no snapshot: the next
open replays.

**The check.**  The snapshot stands for the database only if its token is
the mark and the files are unchanged: a write by an older release (which
keeps the mark, not knowing it) or by hand changes the fingerprint.  The mark
is deleted and committed at every open, before it fires (the file is
removed after): a crash after that start replays, and the snapshot is never
used twice.
"""

from __future__ import annotations

import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path

from mqserver.model import Recovered
from mqserver.storage import snapshot

_FINGERPRINT = struct.Struct("<QQQQ")


def fingerprint(path: Path) -> bytes:
    """The database file's size, mtime and inode and its WAL's size (b"": no file)."""
    wal = path.with_name(path.name + "-wal")
    try:
        stat = path.stat()
    except FileNotFoundError:
        return b""
    wal_size = wal.stat().st_size if wal.exists() else 0
    return _FINGERPRINT.pack(stat.st_size, stat.st_mtime_ns, stat.st_ino, wal_size)


def take_thd(conn: sqlite3.Connection, path: Path, files: bytes,
             notes: list[str]) -> Recovered | None:
    """The state the snapshot at ``path`` holds if the database (whose fingerprint
    was ``files`` before it was opened) is as the clean close left it; None:
    replay.  The mark is gone when this returns (the store removes the file once
    its open fired: ``snapshot.discard_after_open``)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'snapshot'").fetchone()
    if row is not None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM meta WHERE key = 'snapshot'")
        conn.execute("COMMIT")
    if row is None and not path.exists():
        return None
    started = time.perf_counter()
    recovered = None

    def unchanged(section: snapshot.SectionReader) -> None:
        if section.rest() != files:
            raise snapshot.SnapshotError("stale: the database files changed since")

    try:
        if row is None:
            raise snapshot.SnapshotError("stale: the database holds no mark of it")
        recovered = snapshot.read(path, row[0], unchanged).recovered
        notes.append(f"clean-shutdown snapshot {path} used: {len(recovered.queues)} queues, "
                     f"{snapshot.message_count(recovered)} messages read in "
                     f"{time.perf_counter() - started:.3f} s (no replay)")
    except (snapshot.SnapshotError, OSError) as e:
        notes.append(f"clean-shutdown snapshot {path} not used ({e}); replaying the database")
    return recovered


def save_thd(conn: sqlite3.Connection, close: Callable[[], None], database: Path, path: Path,
             state: Recovered) -> tuple[bool, str]:
    """Mark the database in its last transaction, ``close`` it, then write the
    snapshot; (saved, a line to log).  A failure is reported, not raised: the
    database is closed all the same and the next open replays."""
    started = time.perf_counter()
    token = snapshot.new_token()
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('snapshot', ?)",
                     (token,))
        conn.execute("COMMIT")
    except sqlite3.Error as e:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        close()
        return False, f"clean-shutdown snapshot {path} not written: no mark ({e})"
    close()
    try:
        size = snapshot.write(path, state, token, fingerprint(database))
    except Exception as e:  # the stop goes on; the next open replays
        return False, f"clean-shutdown snapshot {path} not written ({e})"
    return True, (f"clean-shutdown snapshot {path} written: {snapshot.message_count(state)} "
                  f"messages, {size} bytes, in {time.perf_counter() - started:.3f} s with "
                  "the database's close")
