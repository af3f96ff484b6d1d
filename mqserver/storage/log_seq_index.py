# -*- test-case-name: tests.unit.test_log_seq_index -*-
"""One queue's live messages in the log index: the newest in a dict, the rest as runs.

A dict entry costs about 110 bytes (the entry, an int key, a 128-bit
location int); a million waiting messages would cost more than their packed
bodies.  Past ``ARCHIVE_AT`` entries (``log_index``), or once a backlog is at
rest (``log_rest``), the dict's entries are *archived* as runs: a burst of
publishes into one queue has consecutive seqs and lands as contiguous frames
of one size in one segment (a batch's frames, up to its commit record), so
one run (first seq, count, segment, offset and size of its first frame: 24
bytes) stands for all of them.  Entries that fit no run (another queue's
frames between them, sizes that differ) are runs of one: 24 bytes an entry,
what the three per-entry arrays before them cost.

Runs are sorted by seq.  A remove at either end of a run shrinks it (FIFO
acks take the head, first in line: an ack is on W3's hot path once a
backlog is archived); one inside a run is a *hole*, a seq in a set, until
the head passes it or there are enough holes to split the runs at them
(``mend``).  An archived entry whose record moves (compaction, a requeue in
place) is rewritten in its run when it is a run of one, extends the run
before it when it follows that run's last frame (compaction copies a run's
records in order), splits its run while there are few runs (an insert moves
them all), and otherwise leaves the runs for the dict, which the next
``archive`` merges back in seq order.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, count, islice

_SIZE = 0xFFFFFFFF  # the frame size in a ``loc``; also the largest segment number a run holds
_PLACE = (1 << 64) - 1  # offset << 32 | size of a ``loc``

HOLES = 4096
"""Holes a ``SeqIndex`` keeps before it considers splitting its runs at them."""
SPLIT_RUNS = 4096
"""Runs up to which a moved entry splits its run in place (each split inserts into
the run arrays, moving the runs after it); past that it goes to the dict."""


def _entries(runs: Iterator[tuple[int, int, int, int]],
             holes: set[int]) -> Iterator[tuple[int, int]]:
    """Every live (seq, location) of ``runs`` (``SeqIndex.runs``), in seq order."""
    for start, n, segment, place in runs:
        pairs = zip(range(start, start + n), count((segment << 64) | place, (place & _SIZE) << 32))
        if holes:
            yield from ((seq, location) for seq, location in pairs if seq not in holes)
        else:
            yield from pairs


class Pieces:
    """Slices read as one sequence: its length, and its items in order (in C)."""

    __slots__ = ("count", "pieces")

    def __init__(self, pieces: list[Sequence], count: int) -> None:
        self.pieces, self.count = pieces, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.pieces)


class SeqIndex(dict[int, int]):
    """One queue's live messages: seq -> location, the newest in the dict itself.

    Callers use the dict first, as C code, and the runs only for a seq at or
    below ``last`` (the highest archived seq): ``take``, ``put_old`` and
    ``location``.
    """

    __slots__ = ("counts", "first", "hole_limit", "holes", "last", "places", "segments",
                 "starts")

    def __init__(self) -> None:
        super().__init__()
        self.starts = array("q")  # each run's first seq; the next ones follow it
        self.counts = array("I")  # its seqs: start, start + 1, ...
        self.segments = array("I")  # its segment
        self.places = array("Q")  # offset << 32 | size of its first frame; the next ones follow
        self.holes: set[int] = set()  # seqs removed inside a run
        self.hole_limit = HOLES
        self.first = 0  # the first run that may hold a live entry
        self.last = -1  # the highest archived seq

    # -- archiving ----------------------------------------------------------

    def archive(self) -> None:
        """Move the dict's entries to the runs."""
        items = sorted(self.items())
        self.clear()
        if not items:
            return
        if items[0][0] <= self.last:  # a seq below the archived ones: merge
            old = _entries(self.runs(), self.holes)
            self.starts, self.counts = array("q"), array("I")
            self.segments, self.places = array("I"), array("Q")
            self.holes, self.first = set(), 0
            self._extend(heapq.merge(old, items))
        else:
            self._extend(items)
        self.last = max(self.last, items[-1][0])

    def archive_oldest(self, most: int) -> None:
        """Move the dict's oldest ``most`` entries to the runs (a slice of a backlog
        at rest: ``log_rest``); all of them once no more than ``most`` are left
        (``archive``, which also frees the dict's table).

        The dict's order is the order entries came in, which is seq order as
        publishing goes; an entry at or below the archived ones (a requeue
        into an old seq, a record compaction moved) takes the merging
        ``archive`` instead.
        """
        if len(self) <= most:
            self.archive()
            return
        items = sorted(islice(self.items(), most))
        if items[0][0] <= self.last:
            self.archive()
            return
        for seq, _ in items:
            del self[seq]
        self._extend(items)
        self.last = items[-1][0]

    def _extend(self, items: Iterable[tuple[int, int]]) -> None:
        """Append (seq, location) in seq order, above every archived seq, as runs;
        the last run goes on if the first of them follows it."""
        starts, counts, segments, places = self.starts, self.counts, self.segments, self.places
        start = n = step = base = 0
        if len(starts) > self.first:  # take the last run up again
            start, n = starts.pop(), counts.pop()
            base = (segments.pop() << 64) | places.pop()
            step = (base & _SIZE) << 32
        next_seq, next_location = start + n, base + n * step
        for seq, location in items:
            if seq == next_seq and location == next_location:
                n += 1
            else:
                if n:
                    starts.append(start)
                    counts.append(n)
                    segments.append(base >> 64)
                    places.append(base & _PLACE)
                start, n, base, step = seq, 1, location, (location & _SIZE) << 32
            next_seq, next_location = seq + 1, location + step
        if n:
            starts.append(start)
            counts.append(n)
            segments.append(base >> 64)
            places.append(base & _PLACE)

    # -- archived entries -----------------------------------------------------

    def _run(self, seq: int) -> int:
        """The run that holds ``seq`` live, or -1."""
        starts, counts, r = self.starts, self.counts, self.first
        if r >= len(starts):
            return -1
        if not starts[r] <= seq < starts[r] + counts[r]:
            r = bisect_right(starts, seq, r) - 1
            if r < self.first or seq >= starts[r] + counts[r]:
                return -1
        return -1 if seq in self.holes else r

    def _location(self, r: int, seq: int) -> int:
        place = self.places[r]
        return ((self.segments[r] << 64) | place) + (seq - self.starts[r]) * ((place & _SIZE) << 32)

    def take(self, seq: int) -> int | None:
        """Remove archived ``seq``; its location, or None if it is not there."""
        r = self.first
        starts = self.starts
        if r < len(starts) and starts[r] == seq and not self.holes:  # FIFO: the head
            place = self.places[r]
            location = (self.segments[r] << 64) | place
            n = self.counts[r] - 1
            starts[r] = seq + 1
            self.counts[r] = n
            self.places[r] = place + ((place & _SIZE) << 32)
            if not n:
                self._advance()
            return location
        r = self._run(seq)
        if r < 0:
            return None
        location = self._location(r, seq)
        self._drop(r, seq)
        return location

    def _drop(self, r: int, seq: int) -> None:
        """Take live ``seq`` out of run ``r``: an end shrinks it, else a hole."""
        start, n = self.starts[r], self.counts[r]
        if seq == start:
            place = self.places[r]
            self.starts[r], self.counts[r] = start + 1, n - 1
            self.places[r] = place + ((place & _SIZE) << 32)
            self._trim(r)
        elif seq == start + n - 1:
            self.counts[r] = n - 1
            self._trim(r)
        else:
            holes = self.holes
            holes.add(seq)
            if len(holes) > self.hole_limit:
                if 8 * len(holes) > self.archived_count():
                    self.mend()
                else:
                    self.hole_limit = 2 * len(holes)

    def _trim(self, r: int) -> None:
        """Drop the holes at run ``r``'s ends; an emptied first run is passed."""
        holes = self.holes
        n = self.counts[r]
        if holes and n:
            start, place = self.starts[r], self.places[r]
            step = (place & _SIZE) << 32
            while n and start in holes:
                holes.discard(start)
                start, n, place = start + 1, n - 1, place + step
            while n and start + n - 1 in holes:
                holes.discard(start + n - 1)
                n -= 1
            self.starts[r], self.counts[r], self.places[r] = start, n, place
        if not n and r == self.first:
            self._advance()

    def _advance(self) -> None:
        """The first run is empty: go to the next that is not, and drop a long dead head."""
        counts, first = self.counts, self.first + 1
        end = len(counts)
        while first < end and not counts[first]:
            first += 1
        self.first = first
        if first > 4096 and 2 * first > end:
            del self.starts[:first], counts[:first], self.segments[:first], self.places[:first]
            self.first = 0

    def mend(self) -> None:
        """Split the runs at their holes.  Done once holes are more than an eighth
        of what is archived: the holes' set costs more than the runs it splits
        into, and each hole is a set lookup."""
        holes = sorted(self.holes)
        starts, counts, segments, places = array("q"), array("I"), array("I"), array("Q")
        h, end_h = 0, len(holes)
        for start, n, segment, place in self.runs():
            end, step = start + n, (place & _SIZE) << 32
            while h < end_h and holes[h] < end:
                hole = holes[h]
                h += 1
                if hole < start:  # a hole is always inside a run: a stray one is dropped
                    continue
                if hole > start:
                    starts.append(start)
                    counts.append(hole - start)
                    segments.append(segment)
                    places.append(place)
                place += (hole + 1 - start) * step
                start = hole + 1
            if start < end:
                starts.append(start)
                counts.append(end - start)
                segments.append(segment)
                places.append(place)
        self.starts, self.counts, self.segments, self.places = starts, counts, segments, places
        self.holes, self.first = set(), 0
        self.hole_limit = max(HOLES, sum(counts) // 8)

    def put_old(self, seq: int, location: int) -> int | None:
        """Put ``seq``, at or below ``last``: moved in the runs if archived (its old
        location returned), else into the dict (None; ``archive`` merges it)."""
        r = self._run(seq)
        if r < 0:
            self[seq] = location
            return None
        old = self._location(r, seq)
        starts, counts, segments, places = self.starts, self.counts, self.segments, self.places
        start, n = starts[r], counts[r]
        p = r - 1
        if seq == start and p >= self.first and counts[p] \
                and starts[p] + counts[p] == seq and self._location(p, seq) == location:
            counts[p] += 1  # it follows the run before: that run goes on
            self._drop(r, seq)
            return old
        if n == 1:  # a run of one: rewritten in place
            segments[r], places[r] = location >> 64, location & _PLACE
            return old
        if len(starts) - self.first > SPLIT_RUNS:
            self._drop(r, seq)
            self[seq] = location
            return old
        # split: [start, seq) stays at r, seq alone after it, then (seq, end)
        after = start + n - seq - 1
        if after:
            starts.insert(r + 1, seq + 1)
            counts.insert(r + 1, after)
            segments.insert(r + 1, segments[r])
            places.insert(r + 1, places[r] + (seq + 1 - start) * ((places[r] & _SIZE) << 32))
        starts.insert(r + 1, seq)
        counts.insert(r + 1, 1)
        segments.insert(r + 1, location >> 64)
        places.insert(r + 1, location & _PLACE)
        if seq == start:  # nothing before it: run r goes
            for column in (starts, counts, segments, places):
                del column[r]
            if after:
                self._trim(r + 1)
        else:
            if after:
                self._trim(r + 2)
            counts[r] = seq - start
            self._trim(r)
        return old

    def location(self, seq: int) -> int | None:
        location = self.get(seq)
        if location is None and seq <= self.last:
            r = self._run(seq)
            if r >= 0:
                location = self._location(r, seq)
        return location

    def runs(self) -> Iterator[tuple[int, int, int, int]]:
        """(first seq, count, segment, offset << 32 | size of its first frame) of
        every run from the first that may be live (a count may be 0)."""
        first = self.first
        return zip(islice(self.starts, first, None), islice(self.counts, first, None),
                   islice(self.segments, first, None), islice(self.places, first, None),
                   strict=True)

    def blocks(self, size: int) -> Iterator[tuple[int, int, Sequence, Sequence]]:
        """Every live entry in seq order, ``size`` at a time, as (first seq, last
        seq, seqs, locations): sized iterables, a block's ``len`` its entries.

        A replay packs a million of them (``Replay.result``): one at a time
        (``everything``) that was a tuple, a generator step and two list
        items an entry, 0.25 s per million.  Without holes, and with the
        dict's entries above the runs (a backlog as it is published), a
        run's seqs and locations are two ranges (its frames follow one
        another: each location the last plus its size ``<< 32``), and a
        block is slices of them (``Pieces``), whatever its length.
        """
        fresh = sorted(self.items())
        if self.holes or (fresh and fresh[0][0] <= self.last):
            entries = self.everything()
            while block := list(islice(entries, size)):
                yield block[0][0], block[-1][0], [seq for seq, _ in block], \
                    [location for _, location in block]
            return
        pieces: list[tuple[Sequence, Sequence]] = [
            (range(start, start + n),
             range((segment << 64) | place, ((segment << 64) | place) + n * ((place & _SIZE) << 32),
                   (place & _SIZE) << 32))
            for start, n, segment, place in self.runs() if n]
        if fresh:
            pieces.append(([seq for seq, _ in fresh], [location for _, location in fresh]))
        seqs: list[Sequence] = []
        locations: list[Sequence] = []
        wanted = size
        for piece_seqs, piece_locations in pieces:
            at = 0
            while at < len(piece_seqs):
                take = min(wanted, len(piece_seqs) - at)
                seqs.append(piece_seqs[at:at + take])
                locations.append(piece_locations[at:at + take])
                at += take
                wanted -= take
                if not wanted:
                    yield seqs[0][0], seqs[-1][-1], Pieces(seqs, size), Pieces(locations, size)
                    seqs, locations, wanted = [], [], size
        if seqs:
            count = size - wanted
            yield seqs[0][0], seqs[-1][-1], Pieces(seqs, count), Pieces(locations, count)

    def archived(self) -> Iterator[tuple[int, int]]:
        """Every archived (seq, location), in seq order, one at a time."""
        return _entries(self.runs(), self.holes)

    def locations_in(self, segment: int) -> list[int]:
        """Every live location in ``segment`` (compaction's head), a run at a time."""
        found = [location for location in self.values() if location >> 64 == segment]
        holes = self.holes
        for start, n, in_segment, place in self.runs():
            if in_segment == segment and n:
                base, step = (segment << 64) | place, (place & _SIZE) << 32
                found += (base + (seq - start) * step for seq in range(start, start + n)
                          if seq not in holes)
        return found

    def lookup_cost(self) -> int:
        """The steps ``locations_in`` takes: an entry of the dict, a run."""
        return len(self) + len(self.starts) - self.first

    def archived_count(self) -> int:
        return sum(islice(self.counts, self.first, None)) - len(self.holes)

    def everything(self) -> Iterator[tuple[int, int]]:
        """Every live (seq, location), in seq order, one at a time (a million
        tuples at once would be a hundred megabytes)."""
        fresh = sorted(self.items())
        if not fresh or fresh[0][0] > self.last:  # the dict holds the newest: as usual
            return chain(self.archived(), fresh)
        return heapq.merge(self.archived(), fresh)
