"""Consuming over HTTP on a fake clock: long polls, leases, acks, closing connections."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.web.client import ResponseNeverReceived

from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq.protocol import PHPMQFactory
from mqserver.testing import RecordingSink


def consume(web, queue="q", **fields):
    return web.start("POST", f"/api/queues/{queue}/consume", json=fields)


def bodies(answer):
    return [m["body"] for m in answer["messages"]]


def test_long_poll_answers_when_a_message_arrives_and_holds_no_credit_between_polls(web):
    web.broker.declare_queue(b"q")
    pending = consume(web, consumer="w", max=3, timeout=30)
    web.turn()
    assert not web.answered(pending)
    web.broker.publish_to_queue(b"q", b"m1", b"one")
    web.broker.publish_to_queue(b"q", b"m2", b"two")
    web.turn()
    status, answer = web.finish(pending)
    assert status == 200 and bodies(answer) == ["one", "two"] and answer["consumer"] == "w"
    web.broker.publish_to_queue(b"q", b"m3", b"three")
    web.turn()
    assert [m.body for m in web.broker.queues[b"q"].ready] == [b"three"]
    status, settled = web.request("POST", "/api/queues/q/ack",
                                  json={"consumer": "w", "ids": ["m1", "m2", "nope"]})
    assert settled == {"consumer": "w", "settled": ["m1", "m2"], "unknown": ["nope"]}
    web.turn()
    assert len(web.broker.queues[b"q"].ready) == 1, "an ack gives no credit back"
    assert web.broker.queues[b"q"].acked == 2


def test_poll_takes_at_most_max_and_times_out_empty(web):
    web.broker.declare_queue(b"q")
    for n in range(5):
        web.broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    pending = consume(web, max=3, timeout=0)
    web.turn()
    status, answer = web.finish(pending)
    assert status == 200 and bodies(answer) == ["0", "1", "2"]
    assert answer["consumer"].startswith("http-")
    name = answer["consumer"]
    assert len(web.broker.queues[b"q"].ready) == 2
    web.request("POST", "/api/queues/q/ack", json={"consumer": name, "ids": ["m0", "m1", "m2"]})
    web.broker.purge(b"q")
    assert bodies(web.request("POST", "/api/queues/q/consume", json={"consumer": name})[1]) == []
    pending = consume(web, consumer=name, timeout=5)
    web.clock.advance(4.9)
    assert not web.answered(pending)
    web.clock.advance(0.1)
    assert web.finish(pending) == (200, {"consumer": name, "queue": "q", "lease": 30.0,
                                         "messages": []})


def test_lease_expiry_returns_unacked_messages_in_place(web):
    web.broker.declare_queue(b"q")
    for n in range(3):
        web.broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    pending = consume(web, consumer="w", max=2, lease=10)
    web.turn()
    assert bodies(web.finish(pending)[1]) == ["0", "1"]
    web.clock.advance(9)
    web.request("POST", "/api/queues/q/ack", json={"consumer": "w", "ids": ["m0"]})  # renews
    web.clock.advance(9)
    assert web.broker.queues[b"q"].in_flight() == 1
    web.clock.advance(1)
    ready = web.broker.queues[b"q"].ready
    assert [(m.body, m.retry) for m in ready] == [(b"1", 1), (b"2", 0)]
    status, error = web.request("POST", "/api/queues/q/ack", json={"consumer": "w", "ids": ["m1"]})
    assert status == 404 and "lease may have run out" in error["error"]
    assert [c.protocol for c in web.broker.connections.values()] == []


def test_a_waiting_poll_keeps_the_lease_alive(web):
    web.broker.declare_queue(b"q")
    pending = consume(web, consumer="w", timeout=50, lease=5)
    web.clock.advance(20)
    assert b"w" in web.api.consumers.sessions
    web.broker.publish_to_queue(b"q", b"m", b"late")
    web.turn()
    assert bodies(web.finish(pending)[1]) == ["late"]


def test_conflicts_a_second_poll_and_another_queue(web):
    web.broker.declare_queue(b"q")
    web.broker.declare_queue(b"other")
    pending = consume(web, consumer="w", timeout=10)
    status, error = web.request("POST", "/api/queues/q/consume", json={"consumer": "w"})
    assert status == 409 and "already has a poll waiting" in error["error"]
    status, error = web.request("POST", "/api/queues/other/consume", json={"consumer": "w"})
    assert status == 409 and "consumes 'q'" in error["error"]
    web.clock.advance(10)
    assert web.finish(pending)[0] == 200


def test_client_going_away_ends_the_poll_and_the_lease_returns_its_batch(web):
    web.broker.declare_queue(b"q")
    pending = consume(web, consumer="w", timeout=10, lease=5)
    web.stub.flush()
    session = web.api.consumers.sessions[b"w"]
    pending.cancel()
    gone = []
    pending.addErrback(gone.append)
    assert gone[0].check(ResponseNeverReceived)
    web.stub.flush()
    assert session.consumer.window == 0
    web.broker.publish_to_queue(b"q", b"m", b"x")
    web.turn()
    assert len(web.broker.queues[b"q"].ready) == 1
    web.clock.advance(5)
    assert b"w" not in web.api.consumers.sessions


def test_reject_goes_back_to_the_tail(web):
    web.broker.declare_queue(b"q")
    web.broker.publish_to_queue(b"q", b"a", b"a")
    web.broker.publish_to_queue(b"q", b"b", b"b")
    pending = consume(web, consumer="w")
    web.turn()
    assert bodies(web.finish(pending)[1]) == ["a"]
    status, answer = web.request("POST", "/api/queues/q/reject", json={"consumer": "w", "ids": ["a"]})
    assert (status, answer["settled"]) == (200, ["a"])
    assert [(m.body, m.retry) for m in web.broker.queues[b"q"].ready] == [(b"b", 0), (b"a", 1)]


def test_deleting_the_queue_ends_a_waiting_poll(web):
    web.broker.declare_queue(b"q")
    pending = consume(web, consumer="w", timeout=30)
    web.stub.flush()
    assert web.request("DELETE", "/api/queues/q")[0] == 200
    web.turn()
    assert web.finish(pending) == (200, {"consumer": "w", "queue": "q", "lease": 30.0,
                                         "messages": []})
    assert web.api.consumers.sessions == {} and web.broker.connections == {}
    web.broker.declare_queue(b"q")
    pending = consume(web, consumer="w", timeout=30)
    web.stub.flush()
    web.broker.delete_queue(b"q")  # the session is ended next turn...
    web.broker.declare_queue(b"q")
    status, answer = web.request("POST", "/api/queues/q/consume", json={"consumer": "w"})
    assert (status, answer["messages"]) == (200, [])  # ...and a new poll starts afresh
    web.turn()
    assert web.answered(pending)


def test_connections_list_and_close_every_protocol(web):
    def attach(factory):
        protocol = factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.7", 4000))
        protocol.makeConnection(transport)
        return protocol, transport

    mqks, mqks_transport = attach(MQKSFactory(web.broker))
    mqks.dataReceived(b"c consume q e --manual-ack\n")
    phpmq, phpmq_transport = attach(PHPMQFactory(web.broker))
    web.broker.connection_opened("test", "somewhere", RecordingSink())
    web.broker.publish_event(b"e", b"m1", b"x")
    web.turn()
    status, listing = web.request("GET", "/api/connections")
    by_protocol = {c["protocol"]: c for c in listing["connections"]}
    assert set(by_protocol) == {"mqks", "phpmq", "test"}
    assert by_protocol["mqks"]["peer"] == "10.0.0.7:4000"
    assert by_protocol["mqks"]["unacked"] == 1
    [consumer] = by_protocol["mqks"]["consumers"]
    assert (consumer["queue"], consumer["window"], consumer["credit"]) == ("q", None, None)
    assert web.request("GET", "/api/consumers?queue=q")[1]["consumers"] == [consumer]
    assert web.request("GET", "/api/overview")[1]["connections"] == {
        "mqks": 1, "phpmq": 1, "test": 1}
    status, closed = web.request("DELETE", f"/api/connections/{mqks.connection.id}",
                                 json={"reason": "maintenance"})
    assert (status, closed["protocol"]) == (200, "mqks")
    assert mqks_transport.disconnecting
    status, closed = web.request("DELETE", f"/api/connections/{phpmq.connection.id}")
    assert status == 200 and phpmq_transport.disconnecting
    status, error = web.request("DELETE", f"/api/connections/{by_protocol['test']['id']}")
    assert status == 409 and "cannot be closed" in error["error"]


def test_closing_an_http_consumer_returns_its_messages(web):
    web.broker.declare_queue(b"q")
    web.broker.publish_to_queue(b"q", b"m", b"x")
    pending = consume(web, consumer="w")
    web.turn()
    web.finish(pending)
    [connection] = web.broker.connections.values()
    assert connection.protocol == "http" and connection.peer == "127.0.0.1:31337"
    assert web.request("DELETE", f"/api/connections/{connection.id}")[0] == 200
    assert [(m.body, m.retry) for m in web.broker.queues[b"q"].ready] == [(b"x", 1)]
    assert web.api.consumers.sessions == {}
