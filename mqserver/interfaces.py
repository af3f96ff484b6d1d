# -*- test-case-name: tests.unit.test_interfaces -*-
"""The seams of mqserver: storage backends, wire protocols, and the broker they share.

Third parties implement ``IStoragePlugin`` or ``IProtocolPlugin`` in a module of
their own ``twisted/plugins/`` package; ``twistd mqserver`` finds them with
``twisted.plugin.getPlugins``.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IMessageStore(Interface):
    """Makes the broker's state durable and rebuilds it at start.

    The broker's in-memory state is authoritative while it runs; the store
    receives every state change as a batch of operations (see
    ``mqserver.model`` for the op tuples) and replays them at start.  Calls are
    never concurrent: the broker waits for one ``apply`` to fire before it
    sends the next batch, which is how batches become group commits.
    """

    durable = Attribute(
        "bool: True when what ``apply`` accepted survives a process crash. "
        "The broker sends no ops at all to a store that is not durable."
    )

    def open():
        """Open (or create) the store and read back its state.

        :return: Deferred firing with a ``mqserver.model.Recovered``: every
            queue with its options, bindings and ready messages in seq order
            (messages that were in flight when the process stopped come back
            ready), and the next free seq.  Fails if the store cannot be used
            (locked, corrupt beyond repair, unwritable).
        """

    def apply(ops):
        """Apply one batch of operations atomically and durably.

        :param ops: a list of op tuples, in the order the broker made them.
        :return: Deferred firing with None once the whole batch is as durable
            as the store promises; a failure means none of it can be trusted
            to be.  After a failure the broker sends the same ops again (with
            later ones behind them) until a batch succeeds, so applying a
            batch again, whole or after a partial apply, must leave the same
            state: every op is an upsert or a delete keyed by queue and seq
            (or namespace and key).
        """

    def close():
        """Flush and release everything.  :return: Deferred firing with None."""


class ICleanShutdown(Interface):
    """A durable store that keeps a snapshot of the broker's state at a clean stop.

    Optional, beside ``IMessageStore``: the next ``open`` of a store that
    provides it fires with the snapshot's state instead of replaying, when
    the store confirms it unchanged since (docs/storage.md, "The
    clean-shutdown snapshot").  Before that ``open`` fires, the snapshot is
    made unusable durably (its mark in the store cleared, the file
    removed), so a crash at any time after the reopen recovers by replay.
    A snapshot that is missing, stale, truncated or corrupt is logged and
    the store replays: it never fails the start.
    """

    from_snapshot = Attribute(
        "bool: True when the last ``open`` started from the snapshot (no replay)."
    )
    snapshot_path = Attribute(
        "pathlib.Path: the snapshot's file.  Deleting it makes the next open replay."
    )

    def close_clean(state):
        """Close the store, leaving ``state`` for the next ``open`` to start from.

        Called instead of ``close`` by a clean stop, and only once every op
        the broker made is durable in the store (its writer flushed and
        stopped): ``state`` is then exactly what the store holds.

        :param state: a ``mqserver.model.Recovered`` of the broker's durable
            state, each queue's messages a ``mqserver.packed.Backlog`` in seq
            order (in-flight ones at their seq's place).  Read in the store's
            thread; the broker no longer changes it.
        :return: Deferred firing with True once the snapshot and the store's
            mark of it are durable and the store is closed, or with False when
            the store closed without one (a failure writing it is logged, not
            raised: the next ``open`` replays).
        """


class IStoragePlugin(Interface):
    """A storage backend ``--storage NAME`` can choose."""

    name = Attribute("str: the value of --storage that selects this backend.")
    description = Attribute("str: one line for --help.")
    options = Attribute(
        "list of twisted.python.usage optParameters rows "
        "[long, short, default, help] this backend adds to twistd mqserver."
    )

    def build_store(config, reactor):
        """Make the store (do not open it yet).

        :param config: the parsed ``twistd mqserver`` options, a mapping.
        :param reactor: the reactor (also the clock) the store must use.
        :return: an ``IMessageStore`` provider.
        """


class IProtocolPlugin(Interface):
    """A wire protocol ``--protocol NAME[:ENDPOINT]`` can choose."""

    name = Attribute("str: the value of --protocol that selects it.")
    description = Attribute("str: one line for --help.")
    default_endpoint = Attribute(
        "str: server endpoint description used when none is given, "
        "e.g. 'tcp:25000:interface=127.0.0.1'."
    )
    options = Attribute("list of optParameters rows this protocol adds.")

    def build_factory(broker, config):
        """Make the factory for listening connections.

        :param broker: the ``IBroker`` every connection talks to.
        :param config: the parsed ``twistd mqserver`` options, a mapping.
        :return: an ``IProtocolFactory`` provider.
        """

    def extra_listeners(broker, config):
        """Further endpoints the protocol needs beside its main one.

        Some protocols listen on several sockets that share state (eMQP has a
        frontend, a backend for workers and an admin socket), while
        ``--protocol NAME[:ENDPOINT]`` names one endpoint.  ``makeService``
        calls this once per protocol name, after ``build_factory``, and starts
        a listener for each entry; most protocols return ``[]``.

        :param broker: the same ``IBroker`` ``build_factory`` got.
        :param config: the parsed ``twistd mqserver`` options, a mapping.
        :return: a list of ``(label, endpoint_string, factory)``; the label
            names the listener in the ``"{label} listening on {host}:{port}"``
            log line (e.g. ``emqp-backend``).

        A plugin may also name the options those endpoints come from in an
        ``extra_endpoint_options`` tuple (eMQP: ``("emqp-backend",
        "emqp-admin")``): ``makeService`` can then see, before the reactor is
        imported, that no listener uses TLS and start without pyOpenSSL
        (``mqserver.tls_import``).  Without it a server keeps TLS importable.
        """


class IDeliverySink(Interface):
    """Where the broker hands messages for a consumer: a protocol connection."""

    def deliver(consumer, message):
        """Send ``message`` to ``consumer``'s client now (buffered per turn).

        Called synchronously by the broker's dispatch loop; must not call back
        into the broker.

        :return: True if this delivery needs no ack from the client (eMQP's
            untracked requests: the protocol has no way to settle them
            later): a manual-ack consumer's delivery is then acked at once,
            by the dispatch loop.  Anything else (None) leaves it to the
            consumer's ack mode.
        """

    def queue_changed(consumer):
        """The bindings or options of ``consumer.queue`` changed, or it was deleted
        (``consumer.queue.deleted``); tell the client if the protocol can (MQKS
        ``--update``).  Must not call back into the broker."""


class IClientConnection(Interface):
    """A client connection an operator may close (``DELETE /api/connections/ID``).

    Provided by the ``sink`` of a broker ``Connection`` whose protocol can
    drop its client.  The broker core never calls it; only the HTTP API does.
    """

    def close(reason):
        """Drop the client.  The connection's consumers are cancelled and their
        unacked messages requeued when it is gone, as on any disconnect.

        :param reason: text for the log, e.g. who asked.
        """


class IFlowControlled(Interface):
    """A connection whose reading the broker may stop: the memory alarm.

    Protocols register one with ``broker.flow.publishing(conn)`` when it
    publishes (see ``mqserver.broker.flow``); the broker core never imports
    a protocol, only calls these.
    """

    def pause_reading():
        """Stop reading from the client (``transport.pauseProducing()``) until resumed."""

    def resume_reading():
        """Read from the client again."""


class IBroker(Interface):
    """The queue core as protocols and the HTTP API see it.

    Names and ids are bytes.  Operations that change state take effect at once
    in memory; the ones that return a Deferred fire it when the change is
    durable (immediately with a non-durable store).
    """

    clock = Attribute("IReactorTime the broker schedules on.")
    queues = Attribute("dict[bytes, Queue]: read-only view for stats.")

    def connection_opened(protocol, peer, sink):
        """Register a client connection. :return: a ``Connection`` record."""

    def connection_closed(connection):
        """Cancel every consumer of the connection, requeuing its unacked messages."""

    def publish_event(event, message_id, body, headers=None, ttl=None, source=None):
        """Copy a message into every queue bound to ``event`` (exact or mask).

        :return: the number of queues it went to.
        """

    def publish_to_queue(queue, message_id, body, headers=None, ttl=None, source=None):
        """Append a message to one queue, creating the queue if needed.

        :raises QueueFullError: the queue is full and its overflow is
            ``reject-publish``; nothing was stored.
        """

    def publish_event_run(event, entries, headers=None, ttl=None, source=None):
        """``publish_event`` for each ``(message_id, body)`` of ``entries`` in turn.

        What a protocol calls for consecutive publishes of one client in one
        received chunk: the event is routed and the clock read once, which
        halves what the broker spends per message.  Each queue gets the same
        messages in the same order as from single publishes; they share the
        run's time.

        :return: the number of queues each message went to (0: unroutable).
        :raises QueueFullError: a queue refused one (``reject-publish``):
            ``error.stored`` entries before it were stored, it and the rest
            were not.
        """

    def publish_to_queue_run(queue, entries, headers=None, ttl=None, source=None):
        """``publish_to_queue`` for each ``(message_id, body)`` of ``entries`` in turn.

        :raises QueueFullError: as ``publish_event_run``.
        """

    def durable():
        """:return: Deferred firing with None when everything done so far is durable."""

    def consume(connection, consumer_id, queue, window=None, manual_ack=True):
        """Start a consumer on ``queue``. :return: the ``Consumer``."""

    def cancel(consumer, requeue=True):
        """Stop a consumer; its unacked messages go back in their original order."""

    def ack(consumer, message_id):
        """Settle one delivery. :return: True if the consumer held it."""

    def ack_run(consumer, message_ids):
        """``ack`` for each id of ``message_ids`` in turn (unknown or repeated ids included).

        What a protocol calls for consecutive acks of one consumer in one
        received chunk: the lookups and the queue's kick happen once per
        run instead of once per ack.  Counters, journal records and store
        ops are those of the single acks, in the same order; outside a
        held chunk (``hold_pump``) the records share the run's time.

        :return: how many of the ids the consumer held (and so settled).
        """

    def reject(consumer, message_id):
        """Put a delivery back at the queue's tail with retry + 1. :return: bool."""

    def dead_letter(consumer, message_id, reason):
        """Remove a delivery, moving it to the queue's dead-letter target if any."""

    def move(source, target, limit=None, keep_dead_letter_headers=False):
        """Move the oldest ``limit`` (None: all) ready messages of ``source`` to ``target``.

        Ids, bodies and headers are kept (``x-dead-letter-*`` only with
        ``keep_dead_letter_headers``), retries start again at 0.  Stops at the
        target's max-length rather than drop anything.  Moves a bounded chunk
        per reactor turn.  Each message's store ops share a batch, so a crash
        never leaves one in both queues or in neither; ``durable()`` after it
        has fired says when the move is on disk.

        :return: a Deferred firing with a ``mqserver.broker.moving.MoveResult``
            once the last message has moved.
        :raises mqserver.broker.moving.MoveError: a queue is unknown, or both are one.
        """
