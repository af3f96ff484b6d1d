# -*- test-case-name: tests.unit.test_bindings -*-
"""Event bindings: which queues an event is copied into.

A binding is an exact event (``user.created``) or a mask in which ``*``
matches any run of non-dot characters (``user.*.connected``, ``*.deleted``).
Exact bindings are one dict lookup; masks live in a trie keyed by dot
segments so that publishing never scans every mask.  Resolved routes are
cached until the bindings change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CACHE_LIMIT = 65536


def mask_regex(masks: Iterable[bytes]) -> re.Pattern[bytes]:
    """One anchored regex matching any of ``masks`` (``*`` = ``[^.]*``)."""
    return re.compile(
        b"|".join(
            b"[^.]*".join(re.escape(part) for part in mask.split(b"*")) + b"$"
            for mask in masks
        )
    )


class _Node:
    __slots__ = ("literal", "masks", "wild")

    def __init__(self) -> None:
        self.literal: dict[bytes, _Node] = {}
        self.wild: dict[bytes, tuple[re.Pattern[bytes], _Node]] = {}
        # mask -> queues bound to it, for masks ending at this node
        self.masks: dict[bytes, set[bytes]] = {}


class BindingIndex:
    """Maps events to the queues bound to them, both ways."""

    def __init__(self) -> None:
        self.by_queue: dict[bytes, set[bytes]] = {}
        self._exact: dict[bytes, set[bytes]] = {}
        self._root = _Node()
        self._mask_count = 0
        self._cache: dict[bytes, tuple[bytes, ...]] = {}
        # each cached event's first-seen bytes: messages keep that one object
        # instead of the copy every publish parses (48 bytes per message less)
        self.interned: dict[bytes, bytes] = {}

    def route(self, event: bytes) -> tuple[bytes, ...]:
        """The queues ``event`` goes to, each once, in a stable order."""
        found = self._cache.get(event)
        if found is not None:
            return found
        queues = set(self._exact.get(event, ()))
        if self._mask_count:
            self._match(self._root, event.split(b"."), 0, queues)
        found = tuple(sorted(queues))
        if len(self._cache) >= _CACHE_LIMIT:
            self._clear_cache()
        self._cache[event] = found
        self.interned[event] = event
        return found

    def _clear_cache(self) -> None:
        self._cache.clear()
        self.interned.clear()

    def _match(self, node: _Node, parts: list[bytes], depth: int, out: set[bytes]) -> None:
        if depth == len(parts):
            for queues in node.masks.values():
                out.update(queues)
            return
        part = parts[depth]
        child = node.literal.get(part)
        if child is not None:
            self._match(child, parts, depth + 1, out)
        for regex, wild_child in node.wild.values():
            if regex.fullmatch(part):
                self._match(wild_child, parts, depth + 1, out)

    def bind(self, queue: bytes, event: bytes) -> bool:
        """Bind; False if it already was."""
        events = self.by_queue.setdefault(queue, set())
        if event in events:
            return False
        events.add(event)
        self._clear_cache()
        if b"*" in event:
            node = self._root
            for part in event.split(b"."):
                if b"*" in part:
                    entry = node.wild.get(part)
                    if entry is None:
                        entry = node.wild[part] = (mask_regex([part]), _Node())
                    node = entry[1]
                else:
                    node = node.literal.setdefault(part, _Node())
            node.masks.setdefault(event, set()).add(queue)
            self._mask_count += 1
        else:
            self._exact.setdefault(event, set()).add(queue)
        return True

    def unbind(self, queue: bytes, event: bytes) -> bool:
        """Unbind; False if it was not bound."""
        events = self.by_queue.get(queue)
        if not events or event not in events:
            return False
        events.discard(event)
        if not events:
            del self.by_queue[queue]
        self._clear_cache()
        if b"*" in event:
            self._unbind_mask(self._root, event.split(b"."), 0, event, queue)
            self._mask_count -= 1
        else:
            queues = self._exact[event]
            queues.discard(queue)
            if not queues:
                del self._exact[event]
        return True

    def _unbind_mask(
        self, node: _Node, parts: list[bytes], depth: int, mask: bytes, queue: bytes
    ) -> bool:
        """Remove ``queue`` from ``mask``; prune empty nodes.  True if node is empty."""
        if depth == len(parts):
            queues = node.masks[mask]
            queues.discard(queue)
            if not queues:
                del node.masks[mask]
        else:
            part = parts[depth]
            if b"*" in part:
                _regex, child = node.wild[part]
                if self._unbind_mask(child, parts, depth + 1, mask, queue):
                    del node.wild[part]
            else:
                child = node.literal[part]
                if self._unbind_mask(child, parts, depth + 1, mask, queue):
                    del node.literal[part]
        return not (node.masks or node.literal or node.wild)

    def events_of(self, queue: bytes) -> set[bytes]:
        """The events and masks ``queue`` is bound to (a copy)."""
        return set(self.by_queue.get(queue, ()))

    def unbind_all(self, queue: bytes) -> set[bytes]:
        """Drop every binding of ``queue``; returns what was bound."""
        events = self.events_of(queue)
        for event in events:
            self.unbind(queue, event)
        return events

    def event_count(self) -> int:
        """How many distinct events and masks have at least one queue."""
        return len({event for events in self.by_queue.values() for event in events})
