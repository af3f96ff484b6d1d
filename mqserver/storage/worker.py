# -*- test-case-name: tests.unit.test_storage_sqlite -*-
"""One dedicated thread per durable store, for every blocking call it makes.

Why exactly one: a SQLite connection belongs to the thread that made it, and
a log file needs its writes in the order the broker made them.  A thread pool
of size one gives both at once, serialization and FIFO order, so the stores
need no locks.  Functions that run there are named ``*_thd`` (buildbot's
convention) and touch nothing the reactor thread uses; they get plain data
and return plain data.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    return threading.Thread(*args, daemon=True, **kwargs)


class StoreThread:
    """A single-thread ``ThreadPool`` with a reactor shutdown hook.

    The hook matters for tests and for a reactor stopped without
    ``close()``: a pool thread that is never stopped keeps the process alive.
    """

    def __init__(self, reactor: Any, name: str) -> None:
        self._reactor = reactor
        self._name = name
        self._pool: ThreadPool | None = None
        self._trigger: Any = None

    @property
    def running(self) -> bool:
        return self._pool is not None

    def start(self) -> None:
        """Start a fresh thread (a stopped pool cannot be restarted, so each start makes one)."""
        if self._pool is not None:
            return
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name=self._name)
        # daemon: a store nobody closed must not keep the process from exiting
        # (an exit then is a crash as far as the data is concerned, which the
        # stores are built to survive)
        self._pool.threadFactory = _daemon_thread
        self._pool.start()
        self._trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self.stop)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """Call ``function(*args, **kwargs)`` in the thread, after everything queued before."""
        if self._pool is None:
            raise RuntimeError(f"{self._name} thread is not running")
        return deferToThreadPool(self._reactor, self._pool, function, *args, **kwargs)

    def start_with(self, function: Callable[[], T]) -> Deferred[T]:
        """Start the thread and run ``function`` (a store's open) first; a failure stops it."""
        self.start()

        def failed(failure: Any) -> Any:
            self.stop()
            return failure

        return self.run(function).addErrback(failed)

    def stop_after(self, function: Callable[[], None]) -> Deferred[None]:
        """Run ``function`` (a store's close) last, then stop the thread, whatever it did."""
        if self._pool is None:
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
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
