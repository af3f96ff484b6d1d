# -*- test-case-name: tests.unit.test_storage_sqlite -*-
"""One dedicated thread per durable store, for every blocking call it makes.

Why exactly one: a SQLite connection belongs to the thread that made it, and
a log file needs its writes in the order the broker made them.  One thread
taking calls from one FIFO queue gives both at once, serialization and
order, so the stores need no locks.  Functions that run there are named
``*_thd`` (buildbot's convention) and touch nothing the reactor thread uses;
they get plain data and return plain data.

Why not Twisted's ``ThreadPool`` (this used one of size one): an idle pool
worker still holds what its last call was made of (the call's closures
and cells, and a lock and a bound method for the ``queue.Queue`` wait it
blocks in), all made as the last batch of a burst went out.  Read from the
pool headers of a SQLite server at rest with 1M packed messages, those
objects kept three or four arenas (1 MiB each) of the fill alive.  Here the
thread lets go of each call once it is done, and ``SimpleQueue.get``
allocates nothing to wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

T = TypeVar("T")

_Call = tuple[Deferred[Any] | None, Callable[..., Any], tuple[Any, ...], dict[str, Any]]

log = Logger()


class StoreThread:
    """A thread that runs calls in order and fires their Deferreds on the reactor,
    with a reactor shutdown hook.

    The hook matters for tests and for a reactor stopped without
    ``close()``: a thread that is never stopped would be left waiting.
    """

    def __init__(self, reactor: Any, name: str) -> None:
        self._reactor = reactor
        self._name = name
        self._calls: SimpleQueue[_Call | None] | None = None
        self._thread: threading.Thread | None = None
        # the last thread started, kept after a stop (its queued calls still run then)
        self._worker: threading.Thread | None = None
        self._trigger: Any = None
        # a call is queued, or the thread stopped, under it: a call queued from
        # another thread (``post``) either runs or is refused, never left behind
        # the stop's sentinel
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def is_current(self) -> bool:
        """Whether the caller runs in this thread (a call that would wait for it must not)."""
        return self._worker is threading.current_thread()

    def start(self) -> None:
        """Start a fresh thread (each start makes one: a stopped one is not reused)."""
        if self._thread is not None:
            return
        self._calls = SimpleQueue()
        # daemon: a store nobody closed must not keep the process from exiting
        # (an exit then is a crash as far as the data is concerned, which the
        # stores are built to survive)
        self._thread = threading.Thread(target=self._work, args=(self._calls,),
                                        name=self._name, daemon=True)
        self._worker = self._thread
        self._thread.start()
        self._trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self.stop)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """Call ``function(*args, **kwargs)`` in the thread, after everything queued before."""
        d: Deferred[T] = Deferred()
        self._put((d, function, args, kwargs))
        return d

    def post(self, function: Callable[..., object], *args: Any) -> None:
        """Call ``function(*args)`` in the thread, after everything queued before, with no
        Deferred: for a caller in any thread that waits for the outcome by its own
        means (``sqlite_chunks.ChunkReader``).  An exception it raises is logged.
        RuntimeError if the thread is not running: the call would never run."""
        self._put((None, function, args, {}))

    def _put(self, call: _Call) -> None:
        with self._lock:
            if self._calls is None:
                raise RuntimeError(f"{self._name} thread is not running")
            self._calls.put(call)

    def _work(self, calls: SimpleQueue[_Call | None]) -> None:
        """The thread: each call in turn, its outcome handed to the reactor thread."""
        from_thread = self._reactor.callFromThread
        while (call := calls.get()) is not None:
            d, function, args, kwargs = call
            # nothing of a call stays referenced while the thread waits for the next
            del call
            try:
                result = function(*args, **kwargs)
            except BaseException:
                if d is None:
                    from_thread(log.failure, "{name}: a posted call failed", Failure(),
                                name=self._name)
                else:
                    from_thread(d.errback, Failure())
            else:
                if d is not None:
                    from_thread(d.callback, result)
                del result
            del d, function, args, kwargs

    def start_with(self, function: Callable[[], T]) -> Deferred[T]:
        """Start the thread and run ``function`` (a store's open) first; a failure stops it."""
        self.start()

        def failed(failure: Any) -> Any:
            self.stop()
            return failure

        return self.run(function).addErrback(failed)

    def stop_after(self, function: Callable[[], None]) -> Deferred[None]:
        """Run ``function`` (a store's close) last, then stop the thread, whatever it did."""
        if self._thread is None:
            return succeed(None)

        def stop(result: Any) -> Any:
            self.stop()
            return result

        return self.run(function).addBoth(stop)

    def stop(self) -> None:
        """Let queued work finish, then join the thread (it is idle by then)."""
        if self._trigger is not None:
            trigger, self._trigger = self._trigger, None
            # ValueError/KeyError: the trigger is what is running us
            with contextlib.suppress(ValueError, KeyError):
                self._reactor.removeSystemEventTrigger(trigger)
        with self._lock:
            thread, calls = self._thread, self._calls
            self._thread = self._calls = None
            if calls is not None:
                calls.put(None)
        if thread is not None and calls is not None and thread is not threading.current_thread():
            thread.join()
