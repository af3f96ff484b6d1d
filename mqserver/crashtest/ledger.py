"""What the clients know for sure, and what it allows a restarted server to give back.

Every copy of a message in a queue (a publish to an event bound to two
queues makes two copies) has a *home* queue, maybe a dead-letter target, and
the list of the operations the clients sent for it, in the order the server
applied them: the publish, then each settle (ack, reject, requeue, dead
letter, purge, ...), each with the place it leaves the copy in: ``home``,
``dead`` (the target) or ``none`` (gone).  An operation is

- *sent*: it may or may not have been applied;
- *processed*: the server applied it (an answer or a delivery proved it), but
  it may not be durable yet;
- *durable*: its own confirm answered, or a confirmed no-op that the client
  sent after it was processed did (the store's writer fires a confirm only
  once every op added before it is durable: ``barrier`` in mqks.py).

A store keeps a prefix of the operations, in order, and that prefix holds
at least every durable one.  So after a kill the copy must be where one of
the operations from the last durable one to the last one sent left it, and
nowhere else; before any durable one, it may also be gone.  A copy found in
two places, or twice in one, is always wrong.  TTL expiry is the server's
own operation: a copy certainly expired before the check must be in its
dead-letter queue (or gone) instead of home; one that may have expired may
be in either.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

HOME, DEAD, NONE = "home", "dead", "none"
SENT, PROCESSED, DURABLE = 0, 1, 2


@dataclass(eq=False)
class Op:
    """One operation on one copy; ``kind`` names it in the reports (``ack``, ``purge``, ...)."""

    kind: str
    place: str
    state: int = SENT


@dataclass(eq=False)
class Copy:
    mid: str
    home: str
    dead: str | None
    ops: list[Op] = field(default_factory=list)
    deliveries: int = 0  # in this cycle: what the server's retry count is at the next one
    sent_at: float = 0.0  # wall clock, for TTLs
    confirmed_at: float | None = None
    ttl: float | None = None
    limit: int | None = None  # x-max-retries

    def allowed(self) -> set[str]:
        """The places the copy may be found in after a kill (see the module docstring)."""
        last = max((n for n, op in enumerate(self.ops) if op.state == DURABLE), default=-1)
        places = {op.place for op in self.ops[max(last, 0):]}
        if last < 0:
            places.add(NONE)
        return places

    def expires_before(self, when: float, slack: float) -> bool:
        """Certainly past its TTL at ``when``."""
        return self.ttl is not None and (self.confirmed_at or when) + self.ttl + slack < when

    def expired(self, now_from: float, now_to: float, slack: float) -> set[str]:
        """``allowed``, with TTL expiry between ``now_from`` and ``now_to`` applied."""
        places = self.allowed()
        if self.ttl is None or HOME not in places:
            return places
        gone = DEAD if self.dead else NONE
        if self.expires_before(now_from, slack):
            return {gone if place == HOME else place for place in places}
        if self.sent_at + self.ttl - slack < now_to:
            return places | {gone}
        return places


class Ledger:
    """Every copy of one cycle, and what the drain after the restart found."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.copies: dict[tuple[str, str], Copy] = {}
        self.by_home: dict[str, list[Copy]] = {}  # for purges
        self.done: Counter[str] = Counter()  # durable settles by kind
        self.processed: list[Op] = []  # waiting for a barrier
        self.purging = 0  # purges sent and not answered yet

    def publish(self, mid: str, home: str, dead: str | None, sent_at: float,
                ttl: float | None = None) -> Copy:
        copy = Copy(mid, home, dead, [Op("publish", HOME)], sent_at=sent_at, ttl=ttl)
        self.copies[(home, mid)] = copy
        self.by_home.setdefault(home, []).append(copy)
        return copy

    def confirm(self, op: Op) -> None:
        """``op``'s own confirm answered: it is durable, and so is everything before it."""
        if op.state != DURABLE:
            op.state = DURABLE
            self.done[op.kind] += 1

    def settle(self, copy: Copy, kind: str, place: str) -> Op:
        op = Op(kind, place)
        copy.ops.append(op)
        return op

    def applied(self, op: Op) -> None:
        """The server applied ``op``; a later barrier makes it durable."""
        if op.state == SENT:
            op.state = PROCESSED
            self.processed.append(op)

    def barrier_snapshot(self) -> list[Op]:
        """What the next barrier's confirm will prove durable."""
        ops, self.processed = self.processed, []
        return ops

    def must(self, now: float, slack: float = 0.3) -> set[tuple[str, str]]:
        """(queue, id) pairs that must come back (for the drain's wait), as of ``now``."""
        keys = set()
        for copy in self.copies.values():
            places = copy.expired(now, now, slack)
            if places == {HOME}:
                keys.add((copy.home, copy.mid))
            elif places == {DEAD}:
                keys.add((copy.dead, copy.mid))
        return keys

    def check(self, found: dict[tuple[str, str], int], started: float, ended: float,
              slack: float = 0.3) -> list[str]:
        """Every way the drain (``(queue, id) -> times delivered``) breaks the rules."""
        problems: dict[str, Counter[str]] = {}  # kind -> queue -> copies
        examples: dict[str, str] = {}

        def problem(kind: str, copy: Copy | tuple[str, str]) -> None:
            queue = copy[0] if isinstance(copy, tuple) else copy.home
            problems.setdefault(kind, Counter())[queue] += 1
            examples.setdefault(kind, f"{copy[1]} in {copy[0]}" if isinstance(copy, tuple)
                                else f"{copy.mid} of {copy.home} (ops {_history(copy)})")

        claimed: set[tuple[str, str]] = set()
        for copy in self.copies.values():
            where = {HOME: (copy.home, copy.mid)}
            if copy.dead:
                where[DEAD] = (copy.dead, copy.mid)
            seen = {place for place, key in where.items() if found.get(key)}
            claimed.update(where.values())
            allowed = copy.expired(started, ended, slack)
            if copy.expires_before(started, slack) and copy.ops[0].state == DURABLE:
                self.done["expired"] += 1
            if len(seen) > 1:
                problem("in its queue and its dead-letter queue at once", copy)
                continue
            place = seen.pop() if seen else NONE
            if place not in allowed:
                problem({NONE: "lost", HOME: "back in its queue although settled",
                         DEAD: "dead-lettered although it must not be"}[place], copy)
        for key, times in found.items():
            if key not in claimed:
                problem("in a queue it was never published or dead-lettered to", key)
            elif times > 1:
                problem("delivered twice by the drain", key)
        return [f"{sum(queues.values())} copies {kind} "
                f"({', '.join(f'{q} {n}' for q, n in sorted(queues.items()))}), "
                f"e.g. {examples[kind]}" for kind, queues in sorted(problems.items())]


def _history(copy: Copy) -> str:
    states = {SENT: "sent", PROCESSED: "applied", DURABLE: "durable"}
    return ", ".join(f"{op.kind}->{op.place} {states[op.state]}" for op in copy.ops)
