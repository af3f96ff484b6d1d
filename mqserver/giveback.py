# -*- test-case-name: tests.unit.test_giveback -*-
"""Give memory back to the system after a large backlog was packed (``give_back``).

Packing a backlog at rest (``mqserver.broker.resting``, ``log_rest``) frees
a great many small objects at once, but RSS only falls where whole pieces
of memory are free:

- pymalloc returns an arena (1 MiB) only once every block in it is free,
  and the interpreter's free lists (up to 2,000 spare tuples of each
  length, floats, lists, dicts) keep blocks scattered over the arenas just
  emptied; a full collection clears them (``gc.collect`` clears the free
  lists only when it collects the oldest generation, which the server's
  tuned thresholds make rare);
- CPython's method cache (4,096 entries, a type's attribute lookups) holds
  a reference to each name it caches, and a name made at run time (a C
  call such as ``PyObject_CallMethod(tzinfo, "utcoffset")``, made for
  every log line Twisted's logger formats) is a new ``str`` each time,
  filed under its address: every log line during a fill left one or two
  such strings alive, each in a different arena.  With 1M messages
  published to SQLite (whose writer was far behind and caught up again
  some forty times in a fill, each logged before ``behind_log``) they
  kept 10 to 20 arenas; clearing the cache (``sys._clear_type_cache``) lets them go;
- glibc's malloc gives back only the top of its heap by itself; the
  buffers a durable store's batches went through leave free holes below
  the packed chunks, which ``malloc_trim`` returns page by page.

Measured with 1M ready 100-byte messages (``python -m bench --workload
memory``): the collection took the memory store from 193 to 178 MB, the
trim the log store from 265 to 239 MB; clearing the method cache took
SQLite from 154-159 to 145-146 MB per 1M (marginal).  All run once a backlog is
packed, never on a hot path: a few milliseconds here (the collection walks
every object made since start-up, so more with many unpacked messages).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable
from typing import Any


def malloc_trim() -> Callable[[], Any] | None:
    """glibc's ``malloc_trim(0)`` as a call, or None where the C library has none
    (musl, macOS).  (Also the memory alarm's, ``mqserver.broker.flow``.)"""
    # the process's own symbols, libc's among them: ``find_library`` would run
    # ldconfig in a subprocess at every start
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    return (lambda: trim(0)) if trim is not None else None


_TRIM = malloc_trim()
# CPython's; an interpreter without one has no such cache to clear
_CLEAR_TYPE_CACHE: Callable[[], None] = getattr(sys, "_clear_type_cache", lambda: None)


def give_back(trim: Callable[[], Any] | None = _TRIM) -> None:
    """The method cache cleared, a full collection, then ``malloc_trim(0)``
    where glibc offers it."""
    _CLEAR_TYPE_CACHE()
    gc.collect()
    if trim is not None:
        trim()
