"""``JSONSnapshotStore``: the broker's whole state rewritten as one JSON file per batch.

A teaching example of an ``IMessageStore``, not a production backend: every
batch rewrites the whole state, so a batch costs O(everything stored).  What
it does show is the shape every backend needs:

- ``apply`` takes a *snapshot* on the reactor thread (the broker keeps
  changing its ``Message`` objects after ``apply`` returns), then does the
  blocking I/O in a thread, and fires only once the data is durable;
- durability by write-to-temp, fsync, rename, fsync of the directory, so a
  crash leaves either the old snapshot or the new one, never half of one;
- ``open`` gives messages back in seq order with everything they carried.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from mqserver.interfaces import IMessageStore
from mqserver.model import (
    BIND,
    DECLARE,
    DELETE,
    DELETE_QUEUE,
    ENQUEUE,
    PUT,
    REMOVE,
    REQUEUE,
    UNBIND,
    Message,
    QueueOptions,
    Recovered,
    RecoveredQueue,
)


def _b(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _message(message: Message) -> dict[str, Any]:
    return {
        "id": _b(message.id), "body": _b(message.body), "event": _b(message.event),
        "headers": message.headers, "created_at": message.created_at,
        "expires_at": message.expires_at, "retry": message.retry, "source": message.source,
    }


class StoreClosed(Exception):  # noqa: N818 - the name a reader of the example expects
    """apply() on a store that is not open."""


@implementer(IMessageStore)
class JSONSnapshotStore:
    durable = True

    def __init__(self, path: str | Path, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.path = Path(path)
        self._reactor = reactor
        self._pool: ThreadPool | None = None
        # queue (base64) -> {"options": {...}, "bindings": [...], "messages": {seq: {...}}}
        self._queues: dict[str, dict[str, Any]] = {}
        self._records: dict[str, dict[str, str]] = {}
        self._next_seq = 1
        self.snapshots = 0

    def _run(self, function: Any, *args: Any) -> Deferred[Any]:
        assert self._pool is not None
        return deferToThreadPool(self._reactor, self._pool, function, *args)

    def open(self) -> Deferred[Recovered]:
        # one thread: snapshots are written in the order they were taken
        self._pool = ThreadPool(1, 1, "jsonsnap")
        self._pool.start()
        return self._run(self._read_thd).addCallback(self._loaded)

    def _read_thd(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return {"queues": {}, "records": {}, "next_seq": 1}

    def _loaded(self, state: dict[str, Any]) -> Recovered:
        self._queues, self._records = state["queues"], state["records"]
        self._next_seq = state["next_seq"]
        recovered = Recovered(next_seq=self._next_seq, records={
            _unb(ns): {_unb(k): _unb(v) for k, v in kv.items()}
            for ns, kv in self._records.items() if kv
        })
        for name, queue in self._queues.items():
            raw = _unb(name)
            options = dict(queue["options"])
            options["dead_letter"] = _unb(options["dead_letter"])
            messages = [
                Message(_unb(m["id"]), raw, _unb(m["body"]), int(seq), _unb(m["event"]),
                        m["headers"], m["created_at"], m["expires_at"], m["retry"], m["source"])
                for seq, m in sorted(queue["messages"].items(), key=lambda item: int(item[0]))
            ]
            recovered.queues[raw] = RecoveredQueue(
                raw, QueueOptions(**options), {_unb(e) for e in queue["bindings"]}, messages
            )
        return recovered

    def _queue(self, name: bytes) -> dict[str, Any]:
        key = _b(name)
        if key not in self._queues:
            self._queues[key] = {
                "options": asdict(QueueOptions()),
                "bindings": [], "messages": {},
            }
        return self._queues[key]

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if self._pool is None:
            return fail(StoreClosed("apply() on a closed store"))
        try:
            for op in ops:
                self._apply_one(op)
            snapshot = json.dumps(
                {"queues": self._queues, "records": self._records, "next_seq": self._next_seq}
            )
        except Exception:
            return fail()
        return self._run(self._write_thd, snapshot)

    def _apply_one(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind in (ENQUEUE, REQUEUE):
            message = op[1]
            messages = self._queue(message.queue)["messages"]
            if kind == REQUEUE:
                messages.pop(str(op[2]), None)
            messages[str(message.seq)] = _message(message)
            self._next_seq = max(self._next_seq, message.seq + 1)
        elif kind == REMOVE:
            self._queues.get(_b(op[1]), {}).get("messages", {}).pop(str(op[2]), None)
        elif kind == DECLARE:
            options = asdict(op[2])
            options["dead_letter"] = _b(options["dead_letter"])
            self._queue(op[1])["options"] = options
        elif kind == BIND:
            bindings = self._queue(op[1])["bindings"]
            if _b(op[2]) not in bindings:
                bindings.append(_b(op[2]))
        elif kind == UNBIND:
            bindings = self._queues.get(_b(op[1]), {}).get("bindings", [])
            if _b(op[2]) in bindings:
                bindings.remove(_b(op[2]))
        elif kind == DELETE_QUEUE:
            self._queues.pop(_b(op[1]), None)
        elif kind == PUT:
            self._records.setdefault(_b(op[1]), {})[_b(op[2])] = _b(op[3])
        elif kind == DELETE:
            self._records.get(_b(op[1]), {}).pop(_b(op[2]), None)
        else:
            raise ValueError(f"unknown storage op {kind!r}")

    def _write_thd(self, snapshot: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(snapshot)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.snapshots += 1

    def close(self) -> Deferred[None]:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # runs what is queued, then joins the thread
        return succeed(None)
