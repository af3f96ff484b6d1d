"""give_back: a full collection and, where glibc offers it, malloc_trim."""

from __future__ import annotations

import gc

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
