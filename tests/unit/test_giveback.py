"""give_back: a full collection and, where glibc offers it, malloc_trim."""

from __future__ import annotations

import gc
import sys

from mqserver import giveback


def test_it_collects_and_trims(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    giveback.give_back(lambda: calls.append("trim"))
    assert calls == ["collect", "trim"]


def test_without_malloc_trim_it_only_collects(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    giveback.give_back(None)
    assert calls == ["collect"]


def test_a_c_library_without_malloc_trim_gives_none(monkeypatch):
    class NoTrim:
        pass

    monkeypatch.setattr(giveback.ctypes, "CDLL", lambda name: NoTrim())
    assert giveback.malloc_trim() is None

    def no_library(name):
        raise OSError("no such library")

    monkeypatch.setattr(giveback.ctypes, "CDLL", no_library)
    assert giveback.malloc_trim() is None


def test_glibc_trims():
    trim = giveback.malloc_trim()
    assert trim is None or trim() in (0, 1)


def test_it_lets_go_of_the_names_the_method_cache_holds():
    class Tzinfo:
        def utcoffset(self):
            return None

    # a name made at run time, as a C call's attribute name is: not interned
    name = "".join(["utc", "offset"])
    alone = sys.getrefcount(name)
    getattr(Tzinfo(), name)
    # CPython 3.11's method cache keeps a reference to the name it looked up
    assert sys.getrefcount(name) >= alone
    giveback.give_back(None)
    assert sys.getrefcount(name) == alone
