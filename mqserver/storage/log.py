# -*- test-case-name: tests.unit.test_storage_log -*-
"""The append-only log backend (``--storage=log``): segment files in ``<data-dir>/log/``.

Every ``apply`` batch becomes one contiguous write of CRC-checked records
ending in a COMMIT record (``log_records``), so recovery applies a batch only
if all of it reached the file.  The design follows beanstalkd's binlog and
Kafka's segments (``docs/storage.md``):

- **Threads.**  Records are encoded on the reactor thread, because the
  broker keeps changing its ``Message`` objects after ``apply`` returns; that
  costs a few microseconds per op.  Every file operation (write, fsync,
  roll, unlink, the reads of compaction and recovery) runs in the store's one
  thread, in order.  A write to the page cache is fast, but it can stall when
  the kernel throttles dirty pages, and an fsync takes milliseconds: neither
  may stop the reactor.
- **``--fsync``.**  ``always``: a batch's Deferred fires after its one fsync
  (group commit: one fsync per batch, not per message).  ``interval:MS``
  (default 50): it fires once the batch is written to the kernel, which
  survives a crash of the process; a ``LoopingCall`` on the injected clock
  fsyncs every MS ms if anything was written, so a power cut loses at most
  that window.  ``never``: fsync only when a segment is sealed, a checkpoint
  is written (its position must be on disk) or the store closes.
- **Write failures stop the store** (every later ``apply`` fails): after a
  failed write the file may hold half a batch in its middle, and the index
  no longer matches the disk.  Restarting recovers from the file.
- **Compaction** lives in ``log_compaction`` (the ``Compaction`` mixin).
- **A backlog at rest** has its index archived as compact runs
  (``log_rest``, every ``index_at_rest`` seconds on the injected clock).
- **The checkpoint** (``log_checkpoint``): the index at a durable position,
  written now and then, so a crash restart walks only the records after it.
  An open tries the clean-shutdown snapshot, then the checkpoint, then
  replays the whole log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, fail, inlineCallbacks
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.interfaces import ICleanShutdown, IMessageStore
from mqserver.model import Recovered
from mqserver.storage import log_checkpoint, log_checkpoint_recovery, log_snapshot, snapshot
from mqserver.storage import log_records as records
from mqserver.storage.errors import StoreClosedError, StoreFailedError
from mqserver.storage.log_batch import encode_batch
from mqserver.storage.log_compaction import Compaction
from mqserver.storage.log_index import LogIndex
from mqserver.storage.log_recovery import RecoveryResult, recover_thd
from mqserver.storage.log_rest import IndexAtRest
from mqserver.storage.log_segment import SegmentFiles
from mqserver.storage.worker import StoreThread

log = Logger()

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_CHECKPOINT = "64:5"
"""``--log-checkpoint``: after 64 MiB written (a crash restart walks at most about
that, ~0.5 s for 100-byte messages), or 5 s after a write (docs/storage.md)."""


def parse_fsync(value: str) -> tuple[str, float]:
    """``always``, ``never`` or ``interval:MS`` -> (policy, seconds); ValueError otherwise."""
    if value in ("always", "never"):
        return value, 0.0
    policy, _, ms = value.partition(":")
    if policy == "interval" and ms.isdigit() and int(ms) > 0:
        return policy, int(ms) / 1000.0
    raise ValueError(f"--fsync must be always, never or interval:MS (MS > 0), not {value!r}")


def _log_warning(text: str | None) -> None:
    if text:
        log.warn("{text}", text=text)


@implementer(IMessageStore, ICleanShutdown)
class LogStore(Compaction):
    """``IMessageStore`` on segment files; see the module docstring."""

    durable = True

    def __init__(
        self,
        directory: str | Path,
        reactor: Any = None,
        fsync: str = "interval:50",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        clock: Any = None,
        garbage_ratio: float = 2.0,
        slice_bytes: int = 128 * 1024,
        index_at_rest: float = 1.0,
        checkpoint: str = DEFAULT_CHECKPOINT,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.policy, self.interval = parse_fsync(fsync)
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.garbage_ratio = garbage_ratio
        self.slice_bytes = slice_bytes
        self._clock = clock if clock is not None else reactor
        self._thread = StoreThread(reactor, "mqserver-log")
        self._files = SegmentFiles(self.directory)
        self._index = LogIndex()
        self._segments: dict[int, int] = {}  # number -> bytes, oldest first
        self._total = 0
        self._active = 0
        self._next_seq = 1
        self._failure: Any = None
        self._dirty = False
        self._syncing = False
        self._ticker = LoopingCall(self._tick)
        self._ticker.clock = self._clock
        # seconds between looks for a queue's index at rest (log_rest; 0: never)
        self.index_at_rest = index_at_rest
        self._at_rest = IndexAtRest(self._clock, lambda: self._index,
                                    lambda: self._closing or self._compaction is not None,
                                    lambda: self.checkpoints.rested())
        self._compaction = None
        self._compaction_failed = False
        self._closing = False
        self.is_open = False
        # counters, for tests, stats and the crash soak
        self.batches = 0
        self.records_copied = self.segments_deleted = 0
        self.max_slice_seconds = 0.0
        self.recovery: RecoveryResult | None = None
        # the clean-shutdown snapshot, and whether the last open started from it
        self.snapshot_path = self.directory / snapshot.FILENAME
        self.from_snapshot = False
        self.checkpoints = log_checkpoint.Checkpointer(
            self._thread, self._files, self.directory / log_checkpoint.FILENAME, self._clock,
            self._checkpoint_state, checkpoint)

    # -- lifecycle -----------------------------------------------------------

    def open(self) -> Deferred[Recovered]:
        self._closing = False
        self._thread.start()
        d = self._thread.run(self._open_thd)
        return d.addCallbacks(self._opened, self._open_failed)

    def _open_thd(self) -> RecoveryResult:
        self._files.lock_thd()
        try:
            notes: list[tuple[str, str]] = []
            result = log_snapshot.recover_thd(self._files, self.snapshot_path, notes)
            self.from_snapshot = result is not None
            if result is None:
                result = log_checkpoint_recovery.recover_thd(
                    self._files, self.checkpoints.path, notes)
            if result is None:
                result = recover_thd(self._files)
                result.notes[:0] = notes
            active = max(result.segments, default=0) + 1
            # the new segment makes the snapshot stale, before open fires (the
            # file is removed after: ``snapshot.discard_after_open``)
            self._files.start_segment_thd(active, result.next_seq)
        except BaseException:
            self._files.close_thd()
            raise
        result.segments[active] = records.HEADER_SIZE
        return result

    def _opened(self, result: RecoveryResult) -> Recovered:
        for level, text in result.notes:
            {"error": log.error, "info": log.info}.get(level, log.warn)("{text}", text=text)
        self.recovery = result
        self._index = result.index
        self._segments = result.segments
        self._total = sum(result.segments.values())
        self._active = max(result.segments)
        self._next_seq = result.next_seq
        self.is_open = True
        self._thread.run(snapshot.discard_after_open, self.snapshot_path).addCallback(
            _log_warning)
        if self.policy == "interval":
            self._ticker.start(self.interval, now=False)
        self._at_rest.start(self.index_at_rest)
        # what a crash now would walk: all of it after a snapshot (the checkpoint
        # there may be older), else what this recovery walked
        self.checkpoints.start(self._total if self.from_snapshot else result.walked,
                               result.checkpoint[0] if result.checkpoint else 0)
        log.info("log {dir}: {n} segments, {total} bytes, {live} live; fsync={policy}",
                 dir=str(self.directory), n=len(self._segments), total=self._total,
                 live=self._index.live_total, policy=self.policy)
        self._maybe_compact()
        return result.recovered

    def _open_failed(self, failure: Any) -> Any:
        self._thread.stop()
        return failure

    def metrics(self) -> dict[str, float]:
        """Published by ``/health`` and ``/metrics`` (as ``mqserver_store_*``)."""
        files = self._files
        return {
            "fsyncs_total": files.fsyncs,
            "fsync_seconds_total": files.fsync_seconds,
            "last_fsync_seconds": files.last_fsync_seconds,
            "checkpoints_total": self.checkpoints.written,
            # what a crash restart now would walk past the last checkpoint
            "checkpoint_behind_bytes": self.checkpoints.unchecked,
        }

    @inlineCallbacks
    def close(self) -> Any:
        if not self._thread.running:
            return
        yield self._quiesce()
        try:
            yield self._thread.run(self._files.close_thd)
        finally:
            self._thread.stop()

    @inlineCallbacks
    def close_clean(self, state: Recovered) -> Any:
        """``ICleanShutdown``: write the snapshot (``log_snapshot.save_thd``), then close.

        Not after a failed write (the files may not hold what ``state`` says)
        nor a failed compaction (the index may not match the files; a replay
        rebuilds it).
        """
        if not self._thread.running:
            return False
        yield self._quiesce()
        saved = False
        try:
            if self._failure is None and not self._compaction_failed:
                saved, text = yield self._thread.run(
                    log_snapshot.save_thd, self._files, self.snapshot_path, state,
                    self._next_seq, self._index)
                (log.info if saved else log.error)("{text}", text=text)
            yield self._thread.run(self._files.close_thd)
        finally:
            self._thread.stop()
        return saved

    @inlineCallbacks
    def _quiesce(self) -> Any:
        """No more writes, fsync ticks or compaction: what a close starts with."""
        self.is_open = False
        self._closing = True
        if self._ticker.running:
            self._ticker.stop()
        self._at_rest.stop()
        self.checkpoints.stop()
        if self._compaction is not None:
            yield self._compaction

    # -- writing -------------------------------------------------------------

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if not self.is_open:
            return fail(StoreClosedError("apply() on a closed log store"))
        if self._failure is not None:
            return fail(StoreFailedError(
                f"an earlier write failed ({self._failure.getErrorMessage()}); restart to recover"
            ))
        try:
            data = self._encode_batch(ops)
        except Exception:
            return fail()
        d = self._write(data, self.policy == "always")
        d.addCallback(self._written)
        return d

    def _encode_batch(self, ops: list[tuple[Any, ...]]) -> bytes:
        """A batch's framed records and its COMMIT, as one bytes; moves the index to them.

        An op that does not encode (a bug upstream) stops the store like a
        failed write: the index has moved for the ops before it.
        """
        if self._segments[self._active] >= self.segment_bytes:
            self._roll()
        segment = self._active
        start = self._segments[segment]
        try:
            parts, self._next_seq = encode_batch(ops, self._index, segment, start, self._next_seq)
        except Exception:
            self._failure = Failure()
            log.failure("a storage op did not encode; the store refuses writes until a "
                        "restart recovers it", self._failure)
            raise
        parts.append(records.frame(records.encode_commit(len(ops), self._next_seq)))
        data = b"".join(parts)
        self._grow(segment, start + len(data))
        return data

    def _grow(self, segment: int, size: int) -> None:
        self._total += size - self._segments[segment]
        self._segments[segment] = size

    def _roll(self) -> None:
        self._active += 1
        self._segments[self._active] = 0
        self._grow(self._active, records.HEADER_SIZE)
        # a failure is recorded and logged by _job; the next write reports it
        self._job(self._files.start_segment_thd, self._active, self._next_seq).addErrback(
            lambda _: None
        )

    def _write(self, data: bytes, sync: bool) -> Deferred[None]:
        if not sync:
            self._dirty = True
        d = self._job(self._files.append_thd, data, sync)
        self.checkpoints.wrote(len(data))  # after the write is queued: it comes first
        return d

    def _checkpoint_state(self) -> log_checkpoint.Capture | None:
        """The checkpoint's capture (``log_checkpoint.capture``), or None while the
        index may not match the files."""
        if not self.is_open or self._failure is not None or self._compaction_failed:
            return None
        if sum(map(len, self._index.messages.values())) > log_checkpoint.CAPTURE_DICT_ENTRIES:
            return None  # later: right after the dicts are archived (log_checkpoint)
        return log_checkpoint.capture(self._index, self._segments, self._active, self._next_seq)

    def _job(self, function: Any, *args: Any) -> Deferred[Any]:
        """A write-side job: its failure stops the store (see the module docstring)."""
        d = self._thread.run(function, *args)

        def failed(failure: Any) -> Any:
            if self._failure is None:
                self._failure = failure
                log.failure("log write failed; the store refuses writes until a restart "
                            "recovers it", failure)
            return failure

        return d.addErrback(failed)

    def _written(self, _: None) -> None:
        self.batches += 1
        self._maybe_compact()

    def _tick(self) -> None:
        """Interval fsync: catches and logs its own errors so the LoopingCall never dies."""
        try:
            if not self._dirty or self._syncing or self._failure is not None:
                return
            self._dirty = False
            self._syncing = True

            def done(result: Any) -> None:
                self._syncing = False
                if result is not None and hasattr(result, "getErrorMessage"):
                    log.error("interval fsync failed: {e}", e=result.getErrorMessage())

            self._job(self._files.fsync_thd).addBoth(done)
        except Exception:
            log.failure("interval fsync tick failed; it runs again next interval")

    # -- compaction ----------------------------------------------------------

    def disk_bytes(self) -> int:
        """Bytes in segment files, as the store accounts them."""
        return self._total

    def live_bytes(self) -> int:
        return self._index.live_total

    def drain(self) -> Deferred[None]:
        """Fires once every file operation queued so far has run (tests, benchmarks)."""
        return self._thread.run(lambda: None)
