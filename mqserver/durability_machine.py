# -*- test-case-name: tests.unit.test_durability -*-
"""The durability invariant, tested: a hypothesis state machine drives a real
``Broker`` on a ``task.Clock`` over a real durable store.

Its rules are every state change the broker offers (publishing singles and
runs, consuming, dispatch, each way to settle, TTL expiry, purge, deletes,
an operator's move, bindings and options, connections going away, records,
packing a backlog at rest, the service's check of recovered chunks in a
thread, partway or whole), flushes of the
writer's batches between them, restarts, and, on the log store, its
checkpoint (a crash restart from it).  At each restart and at the end
of an example a fresh store opened on the same files must recover exactly
``broker_state`` (see ``mqserver.durability``); at the end the batches are
also replayed into new stores, cut after batch k, and must recover the state
batch k was made in.

The store runs its real threads and the real reactor; hypothesis runs in a
thread of its own, and every rule runs on the reactor thread (``on_reactor``)
and waits there for the Deferreds it needs, so the broker and the store are
only ever touched from the reactor thread, as in the server.
``verify_store`` is the entry point ``mqserver.testing.StoreContract`` uses.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import Clock
from twisted.internet.threads import blockingCallFromThread, deferToThread

from mqserver.broker.core import KEEP, MAX_RETRIES, Broker
from mqserver.broker.moving import MoveError
from mqserver.broker.overflow import QueueFullError
from mqserver.broker.queue import Slots
from mqserver.broker.ready import CHUNK, PackedReady
from mqserver.broker.saving import durable_state
from mqserver.durability import (
    KEPT_FIELDS,
    Batch,
    RecordingStore,
    State,
    broker_state,
    check_recovered,
    replay,
)
from mqserver.interfaces import ICleanShutdown, IMessageStore
from mqserver.model import QueueOptions, Recovered
from mqserver.packed import Backlog, check_thd
from mqserver.storage.sqlite_chunks import ChunkReader
from mqserver.testing import RecordingSink

EXAMPLES_ENV = "MQSERVER_DURABILITY_EXAMPLES"
"""Environment variable: examples per store (``DEFAULT_EXAMPLES`` without it)."""
DEFAULT_EXAMPLES = 60
STEPS = 50
"""Rules per example, at most."""
PACK_READY_AFTER = 3
"""``--pack-ready-after`` of the machine's broker: small, so ready queues pack."""
PACK_CHUNK = 4
"""Messages per packed chunk of the machine's broker and of the ``Backlog`` its
stores recover into: small, so packed queues hold chunks (recovered backlogs
too, and tails the writer held, packed once it lets go)."""
SETTLE = ("ack", "ack_any", "ack_run", "ack_all", "reject", "reject", "reject_all", "dead_letter")
"""The ways to settle a delivery (``DurabilityMachine.settle``)."""
CRASH_POINTS = 8
"""Crash points checked at the end of an example: every batch, or a spread this many."""

# q0 is the queue the first consumer takes; dlq is where dead letters go
queue_names = st.sampled_from([b"q0", b"q0", b"q1", b"dlq"])
targets = st.sampled_from([("queue", b"q0"), ("event", b"e.a"), ("queue", b"q1"),
                           ("event", b"e.b"), ("queue", b"dlq"), ("event", b"x")])
bindings = st.lists(st.sampled_from([b"e.a", b"e.b", b"x", b"e.*", b"*.b"]), max_size=3)
masks = st.lists(st.sampled_from([b"e.*", b"*.b", b"*"]), max_size=2)
entries = st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.binary(max_size=5)),
                   min_size=1, max_size=4)
headers = st.one_of(
    st.none(),
    st.fixed_dictionaries({MAX_RETRIES: st.sampled_from(["0", "1"])},
                          optional={"k": st.text(max_size=3)}),
    st.fixed_dictionaries({}, optional={"k": st.text(max_size=3)}),
)
ttls = st.sampled_from([None, 0, 1.0, 4.0, 30.0])
sources = st.sampled_from([None, "mqks", "phpmq"])
queue_options = st.builds(
    QueueOptions,
    delete_when_unused=st.sampled_from([None, None, 0.0, 5.0]),
    delete_when_unused_bare=st.booleans(),
    dead_letter=st.sampled_from([None, b"dlq", b"q0"]),
    max_length=st.sampled_from([None, None, 1, 3]),
    default_ttl=st.sampled_from([None, None, 2.0, 20.0]),
    overflow=st.sampled_from([None, "drop-head", "reject-publish"]),
)
picks = st.integers(min_value=0, max_value=7)
damages = st.sampled_from([None, None, None, "truncate", "flip", "stale"])
"""What happens to a clean stop's snapshot before the next start (None: nothing)."""


turn_ends = st.booleans()


def on_reactor(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``function`` on the reactor thread, waiting for the Deferred it may return."""

    @functools.wraps(function)
    def run(self: DurabilityMachine, **kwargs: Any) -> Any:
        return blockingCallFromThread(self.reactor, function, self, **kwargs)

    return run


def step(**strategies: Any) -> Callable[[Callable[..., Any]], Any]:
    """A rule that is one received chunk of some client: the broker's work, then the
    dispatch a protocol runs at a chunk's end (``pump_now``), then, if hypothesis
    drew ``flush``, the end of the reactor turn: the writer hands its batch over
    and the rule waits until it is durable.

    Waiting keeps batch boundaries where the rules put them, not where the
    store's thread happened to be, so a failing example replays the same way.
    """

    def decorate(function: Callable[..., Any]) -> Any:
        @inlineCallbacks
        def body(self: DurabilityMachine, flush: bool, kwargs: dict[str, Any]) -> Any:
            yield function(self, **kwargs)
            self.broker.pump_now()
            if flush:
                yield self._settle()

        @functools.wraps(function)
        def run(self: DurabilityMachine, flush: bool, **kwargs: Any) -> None:
            blockingCallFromThread(self.reactor, body, self, flush, kwargs)

        return rule(flush=turn_ends, **strategies)(run)

    return decorate


def _pick(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)] if items else None


class DurabilityMachine(RuleBasedStateMachine):
    """One example: a broker and its store in a directory of their own.

    ``verify_store`` makes a subclass that sets ``make_store``, ``directory``
    and ``reactor``.
    """

    make_store: Callable[[Path], IMessageStore]
    directory: Path
    reactor: Any

    def __init__(self) -> None:
        super().__init__()
        self.path = Path(tempfile.mkdtemp(dir=self.directory)) / "store"
        self.batches: list[Batch] = []
        self.bursts = 0
        self.old_snapshot: bytes | None = None
        blockingCallFromThread(self.reactor, self._open, 1_000_000.0)

    # -- a broker's life ----------------------------------------------------

    @inlineCallbacks
    def _open(self, now: float, opened: tuple[IMessageStore, Recovered] | None = None) -> Any:
        """A store on ``self.path`` (or ``opened``, a store opened already, with what it
        recovered) and a broker loaded from it; the state recovered."""
        if opened is None:
            inner = self.make_store(self.path)
            recovered: Recovered = yield inner.open()
        else:
            inner, recovered = opened
        store = RecordingStore(inner, self.batches)
        # a clock per broker: a stopped broker's timers must never run
        self.clock = Clock()
        self.clock.advance(now)
        self.broker = Broker(store, self.clock)
        self.broker.pack_ready_after = PACK_READY_AFTER
        self.broker.pack_chunk = PACK_CHUNK
        # packing at rest takes whole heads: a head here is a few messages
        self.broker.resting.least = PACK_CHUNK
        self.broker.resting.keep = 0
        store.broker = self.broker
        self.broker.load(recovered)
        self.store = store
        self.connections: list[Any] = []
        self.slots: dict[int, Slots] = {}
        return recovered

    def consumers(self) -> list[Any]:
        return [consumer for connection in self.connections
                for consumer in connection.consumers.values()]

    def _due(self) -> bool:
        now = self.clock.seconds()
        return any(call.getTime() <= now for call in self.clock.getDelayedCalls())

    @inlineCallbacks
    def _settle(self) -> Any:
        """Run what is due now (dispatch, the writer's flush) until every op is durable."""
        while True:
            self.clock.advance(0)
            yield self.broker.durable()
            if not self.broker.writer.ops and not self._due():
                return

    @inlineCallbacks
    def _reopen(self, when: str) -> Any:
        """Make everything durable, close the store, and check a fresh one on its files."""
        yield self._settle()
        expected, next_seq = broker_state(self.broker), self.broker._seq
        yield self.store.close()
        store = self.make_store(self.path)
        recovered = yield store.open()
        try:
            check_recovered(recovered, expected, next_seq, when)
        finally:
            yield store.close()
        return expected

    # -- publishing ---------------------------------------------------------

    @step(to=targets, entries=entries, headers=headers, ttl=ttls, source=sources,
          burst=st.sampled_from([False] * 7 + [True]))
    def publish(self, to: tuple[str, bytes], entries: list[tuple[bytes, bytes]],
                headers: dict[str, str] | None, ttl: float | None, source: str | None,
                burst: bool) -> None:
        """One message or a run, to an event or a queue.  ``burst`` (once an example):
        more than a chunk of them, so a packed queue packs its tail into chunks."""
        if burst and not self.bursts:
            self.bursts += 1
            entries = [(b"p%d" % n, b"%d" % n) for n in range(CHUNK + 2)]
        kind, name = to
        broker = self.broker
        with contextlib.suppress(QueueFullError):  # a full reject-publish queue refused it
            if kind == "event" and len(entries) == 1:
                broker.publish_event(name, *entries[0], headers, ttl, source)
            elif kind == "event":
                broker.publish_event_run(name, entries, headers, ttl, source)
            elif len(entries) == 1:
                broker.publish_to_queue(name, *entries[0], headers, ttl, source)
            else:
                broker.publish_to_queue_run(name, entries, headers, ttl, source)

    # -- queues, bindings, records ------------------------------------------

    @step(name=queue_names, replace=st.none() | bindings, remove=bindings, remove_masks=masks,
          add=bindings, options=st.just("keep") | queue_options)
    def reconfigure(self, name: bytes, replace: list[bytes] | None, remove: list[bytes],
                    remove_masks: list[bytes], add: list[bytes], options: Any) -> None:
        self.broker.reconfigure(name, replace, remove, remove_masks, add,
                                KEEP if options == "keep" else options)

    @step(name=queue_names, whole=st.booleans())
    def drop(self, name: bytes, whole: bool) -> None:
        """Purge a queue's ready messages, or delete the queue (``whole``) with its
        bindings, consumers and their deliveries."""
        if whole:
            self.broker.delete_queue(name)
        else:
            self.broker.purge(name)

    @step(name=queue_names, to=queue_names, limit=st.none() | st.integers(1, 3),
          keep=st.booleans())
    def move(self, name: bytes, to: bytes, limit: int | None, keep: bool) -> None:
        """An operator moves ready messages (a dead-letter queue replayed, say); each
        message's ENQUEUE and REMOVE share a batch (``mqserver.broker.moving``)."""
        with contextlib.suppress(MoveError):  # an unknown queue, or one onto itself
            moving = self.broker.move(name, to, limit, keep)
            while not moving.called:  # more than a chunk: one per reactor turn
                self.clock.advance(0)

    @step(namespace=st.sampled_from([b"schedules", b"other"]),
          key=st.sampled_from([b"k1", b"k2"]), value=st.none() | st.binary(max_size=4))
    def record(self, namespace: bytes, key: bytes, value: bytes | None) -> None:
        """Keep a record (an eMQP schedule), or delete one (None)."""
        if value is None:
            self.broker.delete_record(namespace, key)
        else:
            self.broker.put_record(namespace, key, value)

    # -- connections and consumers ------------------------------------------

    @initialize(window=st.sampled_from([None, 2]))
    @on_reactor
    def first_consumer(self, window: int | None) -> None:
        """A consumer on q0, bound to e.a, from the start: most rules need one."""
        self.broker.reconfigure(b"q0", add=[b"e.a"])
        self.broker.consume(self._connect(False), b"c0", b"q0", window)

    def _connect(self, settled_on_send: bool) -> Any:
        sink = RecordingSink(settled_on_send=settled_on_send)
        connection = self.broker.connection_opened("test", "peer", sink)
        self.connections.append(connection)
        self.slots[connection.id] = Slots()
        return connection

    @step(pick=picks, new=st.booleans(), settled_on_send=st.booleans(),
          consumer_id=st.sampled_from([b"c0", b"c1"]), name=queue_names,
          window=st.sampled_from([None, 1, 2]), manual_ack=st.booleans(),
          priority=st.sampled_from([0, 0, 1]), shared=st.booleans())
    def consume(self, pick: int, new: bool, settled_on_send: bool, consumer_id: bytes,
                name: bytes, window: int | None, manual_ack: bool, priority: int,
                shared: bool) -> None:
        """Start (or replace) a consumer, on a new connection if ``new`` (or there is none).

        ``settled_on_send``: the connection's deliveries need no ack (eMQP
        untracked requests); ``shared``: its consumers share credit (an eMQP
        worker); a priority makes the queue dispatch by priority.
        """
        if new or not self.connections:
            connection = self._connect(settled_on_send)
        else:
            connection = _pick(self.connections, pick)
        self.broker.consume(connection, consumer_id, name, window, manual_ack, priority,
                            self.slots[connection.id] if shared else None)

    @precondition(lambda self: self.consumers())
    @step(pick=picks, window=st.sampled_from([None, 1, 3]), slots=st.integers(0, 2))
    def credit(self, pick: int, window: int | None, slots: int) -> None:
        """A consumer's window changes; its connection's shared credit grows (eMQP READY)."""
        consumer = _pick(self.consumers(), pick)
        self.broker.set_window(consumer, window)
        if slots:
            self.broker.add_slots(self.slots[consumer.connection.id], slots)

    @precondition(lambda self: self.connections)
    @step(pick=picks, how=st.sampled_from(["requeue", "drop", "connection_closed"]))
    def leave(self, pick: int, how: str) -> None:
        """A consumer is cancelled, its deliveries requeued or dropped, or a whole
        connection goes away (its consumers' deliveries go back)."""
        connection = _pick(self.connections, pick)
        consumer = _pick(list(connection.consumers.values()), pick)
        if how == "connection_closed" or consumer is None:
            self.connections.remove(connection)
            self.broker.connection_closed(connection)
        else:
            self.broker.cancel(consumer, how == "requeue")

    # -- settling -----------------------------------------------------------

    def holding(self) -> list[Any]:
        """The consumers holding deliveries."""
        return [consumer for consumer in self.consumers() if consumer.unacked]

    @precondition(lambda self: self.holding())
    @step(how=st.sampled_from(SETTLE), pick=picks, which=st.lists(picks, min_size=1, max_size=3),
          ttl=st.sampled_from(["keep", None, 0, 1.0, 10.0]))
    def settle(self, how: str, pick: int, which: list[int], ttl: Any) -> None:
        """Settle deliveries of a consumer that holds some, each way the broker offers.

        ``reject`` puts it back at the tail with a retry more and a new TTL
        (``ttl``; "keep": the one it has) or, its ``x-max-retries`` spent,
        dead-letters it; ``ack_run`` gets the picked ids (repeats included)
        and one never held.
        """
        consumer = _pick(self.holding(), pick)
        held = list(consumer.unacked)
        message_id = _pick(held, which[0])
        broker = self.broker
        if how == "ack":
            broker.ack(consumer, message_id)
        elif how == "ack_any":
            broker.ack_any(consumer.queue.name, message_id)
        elif how == "ack_run":
            broker.ack_run(consumer, [_pick(held, n) for n in which] + [b"never held"])
        elif how == "ack_all":
            broker.ack_all(consumer)
        elif how == "reject":
            broker.reject(consumer, message_id, KEEP if ttl == "keep" else ttl)
        elif how == "reject_all":
            broker.reject_all(consumer)
        else:
            broker.dead_letter(consumer, message_id, b"rejected")

    @step()
    def rest(self) -> None:
        """Two looks with nothing moving between them find every large backlog at
        rest; it is packed whole (``mqserver.broker.resting``), which must change
        nothing a store sees: no op, and ``broker_state`` as it was."""
        before = broker_state(self.broker)
        resting = self.broker.resting
        resting.look()
        resting.look()
        while resting.pack_slice():
            pass
        after = broker_state(self.broker)
        assert after == before, f"packing at rest changed the broker's state to {after}"

    # -- time, restarts, crashes --------------------------------------------

    @step(seconds=st.sampled_from([0.5, 1.5, 3.0, 6.0]), sweep=st.booleans())
    def advance(self, seconds: float, sweep: bool) -> None:
        """Time passes: TTLs run out, delete-when-unused timers fire; ``sweep``: the
        TTL sweep runs (the service runs it every second; without it, expired
        messages wait in the queue, where dispatch discards them)."""
        self.clock.advance(seconds)
        if sweep:
            self.broker.expire_due()

    @rule(window=st.sampled_from([None, 2]), look=st.booleans(),
          backlog=st.none() | queue_names)
    @on_reactor
    @inlineCallbacks
    def restart(self, window: int | None, look: bool, backlog: bytes | None) -> Any:
        """Stop and start again, as after a crash (the store replays): in-flight
        messages come back ready, and a client reconnects its consumer on q0.

        ``backlog``: a publisher first leaves a few chunks' worth in that queue,
        without TTLs, which a SQLite replay recovers as chunks it reads later
        (``sqlite_chunks``).  ``look``: check the state the broker loaded at
        once, which reads every such chunk; without, the rules after it reach
        them unread, and the next ``_reopen`` checks what they did."""
        if backlog is not None:
            with contextlib.suppress(QueueFullError):
                self.broker.publish_to_queue_run(
                    backlog, [(b"b%d" % n, b"%d" % n) for n in range(3 * PACK_CHUNK + 1)],
                    None, None, "mqks")
        expected = yield self._reopen("after a restart")
        yield self._open(self.clock.seconds())
        if look:
            loaded = broker_state(self.broker)
            assert loaded == expected, f"a broker loaded the recovered state as {loaded}"
        self.broker.consume(self._connect(False), b"c0", b"q0", window)

    @rule(window=st.sampled_from([None, 2]), damage=damages, at=st.integers(0, 1 << 20),
          crash=st.booleans())
    @on_reactor
    @inlineCallbacks
    def clean_restart(self, window: int | None, damage: str | None, at: int,
                      crash: bool) -> Any:
        """A clean stop (``ICleanShutdown``): the store keeps a snapshot of the broker's
        state, in-flight messages included, and a fresh store starts from it; one
        truncated at ``at``, with the byte there flipped, or ``stale`` (the one an
        earlier clean stop left, or none) is not used: the store replays.  Either
        way it must recover the model.  With ``crash``, a crash right after that
        start: the store is closed without a snapshot and opened again, and must
        replay the same state (the snapshot was made unusable before the first
        open fired); without, the example goes on with the store that started
        from the snapshot (its index too, for the log), and later restarts replay
        what it wrote.
        """
        yield self._settle()
        expected, next_seq = broker_state(self.broker), self.broker._seq
        clean = ICleanShutdown(self.store.inner, None)
        if clean is None:
            yield self.store.close()
        else:
            assert (yield clean.close_clean(durable_state(self.broker))), "no snapshot written"
            self._damage(clean.snapshot_path, damage, at)
        store = self.make_store(self.path)
        recovered = yield store.open()
        withheld = _withheld(recovered)
        if withheld:  # a damaged chunk, found when it is checked, after the open
            try:
                assert damage == "flip", f"chunks withheld from a snapshot {damage or 'intact'}"
                check_recovered(recovered, _without(expected, withheld), next_seq,
                                "after a clean restart, without the damaged chunks")
            finally:  # as a broker's stop after withholding: no snapshot, so the
                yield store.close()  # next open replays, and must give them back
            store = self.make_store(self.path)
            recovered = yield store.open()
        try:
            check_recovered(recovered, expected, next_seq,
                            f"after a clean restart (snapshot {damage or 'intact'})")
            if clean is not None:
                used = ICleanShutdown(store).from_snapshot
                assert used == (damage is None), f"snapshot {damage or 'intact'}, used: {used}"
        except BaseException:
            yield store.close()
            raise
        if crash:
            yield store.close()
            recovered = yield self._open(self.clock.seconds())
            check_recovered(recovered, expected, next_seq,
                            "after a crash following a clean restart")
            assert not getattr(self.store.inner, "from_snapshot", False), "a snapshot used twice"
        else:
            yield self._open(self.clock.seconds(), (store, recovered))
        loaded = broker_state(self.broker)
        assert loaded == expected, f"a broker loaded the recovered state as {loaded}"
        self.broker.consume(self._connect(False), b"c0", b"q0", window)

    @precondition(lambda self: getattr(self.store.inner, "checkpoints", None) is not None)
    @rule(crash=st.booleans(), window=st.sampled_from([None, 2]))
    @on_reactor
    @inlineCallbacks
    def checkpoint(self, crash: bool, window: int | None) -> Any:
        """The log's checkpoint (``log_checkpoint``) at the end of what is written;
        every later restart (a ``close`` writes no snapshot: as a crash leaves the
        files) walks only what came after it.  With ``crash``, one at once: the
        fresh store must start from the checkpoint and recover the model."""
        yield self._settle()
        assert (yield self.store.inner.checkpoints.now()), "no checkpoint written"
        if not crash:
            return
        expected, next_seq = broker_state(self.broker), self.broker._seq
        yield self.store.close()
        store = self.make_store(self.path)
        recovered = yield store.open()
        try:
            check_recovered(recovered, expected, next_seq, "after a crash following a checkpoint")
            assert store.recovery.checkpoint is not None, store.recovery.notes
        except BaseException:
            yield store.close()
            raise
        yield self._open(self.clock.seconds(), (store, recovered))
        self.broker.consume(self._connect(False), b"c0", b"q0", window)

    def _damage(self, path: Path, damage: str | None, at: int) -> None:
        """Damage the snapshot at ``path``; keep an intact copy for a later ``stale``."""
        intact = path.read_bytes()
        if damage == "truncate":
            path.write_bytes(intact[:at % len(intact)])
        elif damage == "flip":
            data = bytearray(intact)
            data[at % len(data)] ^= 0xFF
            path.write_bytes(bytes(data))
        elif damage == "stale":
            if self.old_snapshot is None:
                path.unlink()
            else:
                path.write_bytes(self.old_snapshot)
        self.old_snapshot = intact

    @rule(most=st.integers(1, 3), finished=st.booleans())
    @on_reactor
    @inlineCallbacks
    def background_check(self, most: int, finished: bool) -> Any:
        """The broker's service checks the chunks a start recovered unread in a thread,
        front chunks first (``BrokerService._check_recovered``): here its first
        ``most`` got so far, the rest are left to the rules that reach them; with
        ``finished`` it got through and the broker settles every queue."""
        yield deferToThread(check_thd, self.broker.unchecked_chunks()[:most])
        if finished:
            self.broker.settle_recovered()

    @invariant()
    @on_reactor
    def ready_in_seq_order(self) -> None:
        """Ready messages are in seq order and a seq names one message (a chunk not
        checked yet by its first and last seq: looking must not read it)."""
        seqs = []
        for queue in self.broker.queues.values():
            ready = _ready_seqs(queue.ready)
            assert ready == sorted(ready), f"{queue.name!r} ready out of seq order: {ready}"
            seqs += ready
            seqs += [m.seq for consumer in queue.consumers for m in consumer.unacked.values()]
        assert len(seqs) == len(set(seqs)), f"a seq held twice: {sorted(seqs)}"
        assert not seqs or max(seqs) < self.broker._seq

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:  # a rule failed: only clean up
            blockingCallFromThread(self.reactor, self.store.close)
            return
        blockingCallFromThread(self.reactor, self._final_check)

    @inlineCallbacks
    def _final_check(self) -> Any:
        yield self._reopen("at the end")
        count = len(self.batches)
        if not count:
            return
        points = {count, *range(1, count, max(1, count // CRASH_POINTS))}
        yield replay(self.make_store, self.path.parent / "replay", self.batches, points)


def examples() -> int:
    return int(os.environ.get(EXAMPLES_ENV) or DEFAULT_EXAMPLES)


def verify_store(make_store: Callable[[Path], IMessageStore], directory: Path,
                 max_examples: int | None = None) -> Deferred[None]:
    """Run the machine against stores ``make_store`` makes, each example in a new
    directory under ``directory``; fires when done, fails with hypothesis's report.

    Call it on the reactor thread with the reactor running (pytest-twisted).
    """
    directory.mkdir(parents=True, exist_ok=True)
    machine = type("DurabilityMachine", (DurabilityMachine,), {
        "make_store": staticmethod(make_store), "directory": directory,
        "reactor": _reactor(),
    })
    options = settings(
        max_examples=max_examples or examples(), stateful_step_count=STEPS, deadline=None,
        suppress_health_check=list(HealthCheck), database=None, print_blob=True,
    )
    return deferToThread(_with_small_backlog_chunks, machine, options)


def _ready_seqs(ready: Any) -> list[int]:
    """The seqs of a queue's ready messages, an unchecked chunk's first and last alone."""
    if not isinstance(ready, PackedReady) or not ready.unsettled:
        return [message.seq for message in ready]
    seqs = [message.seq for message in ready.head]
    for chunk in ready.chunks:
        seqs += chunk.seq_range if chunk.unchecked else chunk.seq_column()
    return seqs + [message.seq for message in ready.tail]


def _withheld(recovered: Recovered) -> dict[bytes, list[Any]]:
    """Each queue's snapshot chunks that cannot be read, taken out of its backlog
    (``Backlog.settle``: what a broker does before it reads one)."""
    found = {}
    for name, rq in recovered.queues.items():
        if isinstance(rq.messages, Backlog):
            damaged = rq.messages.settle()
            if damaged:
                found[name] = damaged
    return found


def _without(expected: State, withheld: dict[bytes, list[Any]]) -> State:
    """``expected`` less the messages of the ``withheld`` chunks (by their seqs)."""
    queues = dict(expected.queues)
    for name, chunks in withheld.items():
        spans = [chunk.seq_range for chunk in chunks]
        at = KEPT_FIELDS.index("seq")
        kept = tuple(m for m in queues[name].messages
                     if not any(first <= m[at] <= last for first, last in spans))
        assert len(queues[name].messages) - len(kept) == sum(c.count for c in chunks), \
            f"withheld chunks of {name!r} do not match their messages"
        queues[name] = queues[name]._replace(messages=kept)
    return expected._replace(queues=queues)


def _with_small_backlog_chunks(machine: type[DurabilityMachine], options: settings) -> None:
    """Run the machine while stores recover into chunks of ``PACK_CHUNK`` messages
    and a SQLite replay's chunk reads one more ahead, not a whole queue of them
    (``sqlite_chunks.ChunkReader.read_ahead``): rules still reach chunks unread."""
    read_ahead = ChunkReader.read_ahead
    Backlog.chunk_size, ChunkReader.read_ahead = PACK_CHUNK, 1
    try:
        run_state_machine_as_test(machine, settings=options)
    finally:
        Backlog.chunk_size, ChunkReader.read_ahead = CHUNK, read_ahead


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor
