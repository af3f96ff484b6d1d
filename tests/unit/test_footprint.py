"""What a ready message shares with its neighbours, so a backlog of millions stays small."""

from __future__ import annotations

import pytest


def test_messages_share_the_bound_event_name(broker):
    broker.reconfigure(b"q", replace=[b"user.created", b"user.*"])
    broker.publish_event(b".".join([b"user", b"created"]), b"m1", b"a")  # equal, distinct
    broker.publish_event(b".".join([b"user", b"created"]), b"m2", b"b")
    broker.publish_event(b"user.deleted", b"m3", b"c")
    first, second, third = broker.queues[b"q"].ready
    assert first.event == second.event == b"user.created"
    assert first.event is second.event
    assert third.event == b"user.deleted"


def test_the_shared_event_name_survives_a_binding_change(broker):
    broker.reconfigure(b"q", replace=[b"e"])
    broker.publish_event(b"e", b"m1", b"a")
    broker.reconfigure(b"q", add=[b"f"])
    broker.publish_event(b"e", b"m2", b"b")
    assert [m.event for m in broker.queues[b"q"].ready] == [b"e", b"e"]


def test_publishes_within_a_millisecond_share_created_at(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    clock.advance(10.0)
    broker.publish_event(b"e", b"m1", b"a", ttl=5.0)
    clock.advance(0.0004)
    broker.publish_event(b"e", b"m2", b"b", ttl=5.0)
    clock.advance(0.0006)
    broker.publish_event(b"e", b"m3", b"c")
    m1, m2, m3 = broker.queues[b"q"].ready
    assert m1.created_at == m2.created_at == 10.0
    assert m1.created_at is m2.created_at
    assert m2.expires_at == 15.0
    assert m3.created_at == pytest.approx(10.001)


def test_a_clock_going_back_is_not_hidden_by_the_shared_time(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    clock.advance(10.0)
    broker.publish_event(b"e", b"m1", b"a")
    clock.rightNow = 9.9995
    broker.publish_to_queue(b"q", b"m2", b"b")
    assert [m.created_at for m in broker.queues[b"q"].ready] == [10.0, 9.9995]
