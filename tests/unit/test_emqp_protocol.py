"""The eMQP broker dialog over StringTransport, with the broker on a fake clock."""

from __future__ import annotations

import json
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent

from mqserver.broker.core import Broker
from mqserver.limits import Limits
from mqserver.model import QueueOptions
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.endpoint import EndpointHandler
from mqserver.protocols.emqp.fields import H_CLIENT, H_TRACK
from mqserver.protocols.emqp.scheduler import NAMESPACE
from mqserver.protocols.emqp.service import EMQPService
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.decoder import MessageDecoder

V = b"eMQP/1.0"
RUN = json.dumps(["run", {"callable": "add", "path": "jobs", "args": [1, 2], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}]).encode()
START = 1_700_000_000.0


class Peer:
    """A DEALER on one of the three sockets, speaking ZMTP over a StringTransport."""

    def __init__(self, harness: Harness, router, identity: bytes) -> None:
        self.harness = harness
        self.protocol = router.buildProtocol(None)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
        self.protocol.makeConnection(self.transport)
        greeting = zmtp.greeting(0)
        self.protocol.dataReceived(greeting + zmtp.ready_command(b"DEALER", identity))
        self.identity = self.protocol.identity
        self.decoder = MessageDecoder(2**24, 1024)
        self.transport.clear()

    def send(self, command: bytes, *body: bytes, msgid: bytes = b"mid") -> None:
        self.send_frames([b"", V, command, msgid, *body])

    def send_frames(self, frames: list[bytes]) -> None:
        self.protocol.dataReceived(zmtp.encode_message(frames))
        self.harness.clock.advance(0)

    def recv(self, skip_heartbeats: bool = True) -> list[list[bytes]]:
        self.harness.clock.advance(0)
        data = self.transport.value()
        self.transport.clear()
        messages = [item for item in self.decoder.feed(data) if isinstance(item, list)]
        if skip_heartbeats:
            messages = [m for m in messages if m[2] != b"HEARTBEAT"]
        return messages

    def commands(self) -> list[bytes]:
        return [m[2] for m in self.recv()]

    def lose(self) -> None:
        self.protocol.connectionLost()


class Harness:
    def __init__(self, store=None, **options) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.broker = Broker(store or MemoryStore(), self.clock)
        self.stopped: list[bool] = []
        self.service = EMQPService(
            self.broker, on_disconnect=lambda: self.stopped.append(True), **options
        )
        for router in self.routers():
            router.doStart()

    def routers(self):
        return (self.service.frontend, self.service.backend, self.service.admin)

    def client(self, identity: bytes = b"client") -> Peer:
        return Peer(self, self.service.frontend, identity)

    def worker(self, identity: bytes = b"w1", queues: bytes = b"", ready: int = 0) -> Peer:
        peer = Peer(self, self.service.backend, identity)
        peer.send(codec.INFORM, queues, b"worker", msgid=b"inform-" + identity)
        assert peer.recv()[-1][2:] != []
        for _ in range(ready):
            peer.send(codec.READY)
        return peer

    def admin(self) -> Peer:
        return Peer(self, self.service.admin, b"admin")

    def advance(self, seconds: float, *keep_alive: Peer) -> None:
        """Move time on one second at a time, with ``keep_alive`` peers heartbeating."""
        for _ in range(int(seconds)):
            for peer in keep_alive:
                peer.send(codec.HEARTBEAT, b"0")
            self.clock.advance(1)


@pytest.fixture
def h() -> Harness:
    return Harness()


def request(client: Peer, msgid: bytes, queue: bytes = b"default", headers: bytes = b"",
            payload: bytes = RUN) -> None:
    client.send(codec.REQUEST, queue, headers, payload, msgid=msgid)


# -- INFORM, READY, REQUEST ---------------------------------------------------


def test_worker_inform_is_acked_with_its_msgid(h):
    worker = Peer(h, h.service.backend, b"w1")
    worker.send(codec.INFORM, b'[[10, "default"], [5, "email"]]', b"worker", msgid=b"inf-1")
    [ack] = worker.recv()
    assert ack[:3] == [b"", V, b"ACK"] and ack[4:] == [b"inf-1"]
    assert ack[3] != b"inf-1"
    assert h.service.workers[b"w1"].queues == [(10, b"default"), (5, b"email")]
    assert h.service.workers[b"w1"].slots.free == 0


@pytest.mark.parametrize(
    "body", [[b"not json", b"worker"], [b"", b"robot"], [b"[[1]]", b"worker"], [b""]]
)
def test_bad_inform_gets_no_ack(h, body):
    worker = Peer(h, h.service.backend, b"w1")
    worker.send(codec.INFORM, *body)
    assert worker.recv() == []
    assert h.service.workers == {}


def test_request_waits_for_a_ready_worker_and_keeps_its_msgid(h):
    client = h.client()
    request(client, b"r1", headers=b"")
    [accepted] = client.recv()
    assert accepted[2] == b"REPLY" and accepted[4:] == [b"r1"]
    worker = h.worker()
    assert worker.recv() == []
    worker.send(codec.READY)
    [forwarded] = worker.recv()
    assert forwarded == [b"", V, b"REQUEST", b"r1", b"default", b"", RUN]
    worker.send(codec.READY)
    assert worker.recv() == []


def test_requests_alike_share_their_fields_and_bad_headers_are_refused_each_time(h):
    client, other = h.client(), h.client(b"other")
    for msgid in (b"r1", b"r2"):
        request(client, msgid, queue=b"q", headers=b"guarantee")
    request(other, b"r3", queue=b"q", headers=b"guarantee")
    request(client, b"r4", queue=b"q")
    ready = list(h.broker.queues[b"default"].ready)
    assert [m.id for m in ready] == [b"r1", b"r2", b"r3", b"r4"]
    assert ready[0].headers is ready[1].headers
    assert ready[2].headers is not ready[0].headers  # another client to answer
    assert ready[2].headers[H_CLIENT] == b"other".hex()
    assert ready[3].headers is not ready[0].headers and H_TRACK not in ready[3].headers
    for msgid in (b"bad1", b"bad2"):
        request(client, msgid, headers=b"retry-count:many")
    assert [m.id for m in h.broker.queues[b"default"].ready] == [b"r1", b"r2", b"r3", b"r4"]


def test_client_gets_an_accept_reply_once_stored(h):
    client = h.client()
    request(client, b"r1")
    [reply] = client.recv()
    assert reply[2] == b"REPLY" and reply[4:] == [b"r1"]


def test_unknown_queue_goes_to_default(h):
    worker = h.worker(queues=b'[[10, "default"]]', ready=1)
    client = h.client()
    request(client, b"r1", queue=b"nobody-serves-this")
    [forwarded] = worker.recv()
    assert forwarded[3:5] == [b"r1", b"nobody-serves-this"]
    assert b"nobody-serves-this" not in h.broker.queues


def test_highest_weight_first_then_round_robin_among_equals(h):
    low = h.worker(b"low", b'[[5, "q"]]', ready=3)
    a = h.worker(b"a", b'[[10, "q"]]', ready=2)
    b = h.worker(b"b", b'[[10, "q"]]', ready=2)
    client = h.client()
    for i in range(6):
        request(client, b"r%d" % i, queue=b"q")
    got = {name: [m[3] for m in peer.recv()] for name, peer in (("a", a), ("b", b), ("low", low))}
    assert sorted(got["a"] + got["b"]) == [b"r0", b"r1", b"r2", b"r3"]
    assert len(got["a"]) == len(got["b"]) == 2
    assert got["low"] == [b"r4", b"r5"]


def test_ready_serves_the_workers_queues(h):
    client = h.client()
    request(client, b"e1", queue=b"email")
    worker = h.worker(queues=b'[[10, "default"], [5, "email"]]')
    request(client, b"d1")
    worker.send(codec.READY)
    worker.send(codec.READY)
    assert sorted(m[3] for m in worker.recv()) == [b"d1", b"e1"]


# -- replies, guarantee, retries, timeouts -----------------------------------


def test_reply_requested_result_reaches_the_client(h):
    worker = h.worker(ready=1)
    client = h.client()
    request(client, b"r1", headers=b"reply-requested")
    [forwarded] = worker.recv()
    assert forwarded[5] == b"reply-requested"
    client.recv()
    worker.send(codec.REPLY, b'{"value": 5}', b"r1")
    [result] = client.recv()
    assert result[2] == b"REPLY" and result[4:] == [b'{"value": 5}', b"r1"]
    assert h.broker.in_flight() == 0


def test_untracked_requests_are_settled_on_delivery(h):
    worker = h.worker(ready=1)
    request(h.client(), b"r1")
    assert worker.recv()[0][5] == b""
    assert h.broker.in_flight() == 0
    worker.send(codec.KBYE)
    assert h.broker.ready_count() == 0


def test_guarantee_is_forwarded_with_reply_requested_and_kept_until_the_reply(h):
    w1 = h.worker(b"w1", ready=1)
    client = h.client()
    request(client, b"g1", headers=b"guarantee")
    [forwarded] = w1.recv()
    assert forwarded[5] == b"guarantee,reply-requested"
    assert h.broker.in_flight() == 1
    w1.send(codec.KBYE)
    w2 = h.worker(b"w2", ready=1)
    [again] = w2.recv()
    assert again[3] == b"g1"
    w2.send(codec.REPLY, b'{"value": null}', b"g1")
    assert h.broker.in_flight() == 0 and h.broker.ready_count() == 0
    assert [m[4:] for m in client.recv()] == [[b"g1"]]  # the accept only: no reply asked


def test_retry_count_redelivers_then_dead_letters(h):
    h = Harness(dead_letter=b"emqp-dead")
    client = h.client()
    request(client, b"r1", headers=b"retry-count:2")
    seen = []
    for n in range(3):
        worker = h.worker(b"w%d" % n, ready=1)
        seen += [m[3] for m in worker.recv()]
        worker.send(codec.KBYE)
    assert seen == [b"r1", b"r1", b"r1"]
    assert h.broker.ready_count() == 1
    [dead] = h.broker.queues[b"emqp-dead"].ready
    assert dead.id == b"r1" and dead.headers["x-dead-letter-reason"] == "retries"


@pytest.mark.parametrize(("dead_letter", "outcome"), [
    (None, "retries exhausted, dropped (the queue has no dead-letter queue)"),
    (b"emqp-dead", "retries exhausted, dead-lettered to 'emqp-dead'"),
])
def test_the_log_says_whether_a_request_out_of_retries_was_dropped(dead_letter, outcome):
    h = Harness(dead_letter=dead_letter) if dead_letter else Harness()
    worker = h.worker(ready=2)
    request(h.client(), b"t1", headers=b"timeout:2,retry-count:0")
    worker.recv()
    with capturedLogs() as events:
        h.advance(2, worker)
    lines = [formatEvent(e) for e in events if "t1" in formatEvent(e)]
    assert lines == [f"emqp: request b't1' failed (its timeout passed); {outcome}"]
    dead = h.broker.queues.get(b"emqp-dead")
    assert (len(dead.ready) if dead else 0) == (1 if dead_letter else 0)


def test_reply_requested_alone_is_not_retried(h):
    worker = h.worker(ready=1)
    request(h.client(), b"r1", headers=b"reply-requested")
    worker.recv()
    worker.send(codec.KBYE)
    assert h.broker.ready_count() == 0 and h.broker.in_flight() == 0


def test_timeout_is_enforced_by_the_broker_and_the_client_told(h):
    worker = h.worker(ready=1)
    client = h.client()
    request(client, b"t1", headers=b"timeout:3,reply-requested")
    worker.recv()
    client.recv()
    h.advance(3, worker)
    [result] = client.recv()
    assert result[4:] == [b'{"value": "TimeoutError"}', b"t1"]
    assert h.broker.in_flight() == 0 and h.broker.ready_count() == 0
    worker.send(codec.REPLY, b'{"value": 1}', b"t1")  # too late: dropped
    assert client.recv() == []


def test_timeout_with_retries_redelivers(h):
    worker = h.worker(ready=2)
    request(h.client(), b"t1", headers=b"timeout:2,retry-count:1")
    assert [m[3] for m in worker.recv()] == [b"t1"]
    h.advance(2, worker)
    assert [m[3] for m in worker.recv()] == [b"t1"]
    worker.send(codec.REPLY, b'{"value": "TimeoutError"}', b"t1")  # eventmq's own timeout
    assert h.broker.in_flight() == 0 and h.broker.ready_count() == 0


def test_reply_cancels_the_timeout(h):
    worker = h.worker(ready=1)
    request(h.client(), b"t1", headers=b"timeout:2")
    worker.recv()
    worker.send(codec.REPLY, b'{"value": 1}', b"t1")
    h.advance(5, worker)
    assert h.broker.in_flight() == 0 and worker.recv() == []


def test_a_vanished_worker_is_rerouted_without_using_a_retry(h):
    gone = h.worker(b"gone", ready=1)
    gone.lose()  # TCP closed but still registered: heartbeats have not timed out
    other = h.worker(b"other")
    request(h.client(), b"r1", headers=b"guarantee,retry-count:0")
    assert b"gone" not in h.service.workers
    other.send(codec.READY)
    [forwarded] = other.recv()
    assert forwarded[3] == b"r1"
    assert h.broker.queues[b"default"].consumers[0].unacked[b"r1"].retry == 0


def test_an_operator_closing_a_worker_requeues_its_work_and_drops_it(h):
    worker = h.worker(b"w1", ready=1)
    request(h.client(), b"r1", headers=b"guarantee")
    assert [m[3] for m in worker.recv()] == [b"r1"]
    registered = h.service.workers[b"w1"]
    registered.close("maintenance")
    assert b"w1" not in h.service.workers
    assert worker.transport.disconnecting
    assert [m.id for m in h.broker.queues[b"default"].ready] == [b"r1"]
    other = h.worker(b"w2", ready=1)
    assert [m[3] for m in other.recv()] == [b"r1"]


# -- heartbeats --------------------------------------------------------------


def test_heartbeats_go_to_workers_and_schedulers(h):
    worker = h.worker()
    scheduler = h.client(b"sched")
    scheduler.send(codec.INFORM, b"", b"scheduler", msgid=b"si")
    assert scheduler.commands() == [b"ACK"]
    h.clock.advance(3)
    for peer in (worker, scheduler):
        beats = [m for m in peer.recv(skip_heartbeats=False) if m[2] == b"HEARTBEAT"]
        assert len(beats) == 1 and float(beats[0][4]) == START + 3


def test_silent_peers_are_dropped_and_any_message_counts_as_liveness(h):
    h.worker(b"quiet")
    chatty = h.worker(b"chatty")
    scheduler = h.client(b"sched")
    scheduler.send(codec.INFORM, b"", b"scheduler")
    for _ in range(9):
        chatty.send(codec.READY)
        h.clock.advance(1)
    assert set(h.service.workers) == {b"chatty"}
    assert h.service.schedulers == {}


def test_kbye_and_kbai_remove_peers_at_once(h):
    for command in (codec.KBYE, codec.KBAI):
        worker = h.worker(b"w")
        worker.send(command)
        assert h.service.workers == {}
        scheduler = h.client(b"s")
        scheduler.send(codec.INFORM, b"", b"scheduler")
        scheduler.send(command)
        assert h.service.schedulers == {}


def test_heartbeat_errors_are_logged_and_the_loop_goes_on(h, monkeypatch):
    h.worker()

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(h.service.backend, "send", broken)
    h.clock.advance(3)
    monkeypatch.undo()
    h.clock.advance(3)
    assert h.service._heartbeat.running


# -- schedules ---------------------------------------------------------------


def schedule(client: Peer, interval: bytes = b"10", headers: bytes = b"", cron: bytes = b"",
             command: bytes = codec.SCHEDULE, payload: bytes = RUN) -> None:
    client.send(command, b"default", headers, interval, payload, cron)


def test_schedule_runs_at_once_then_every_interval_and_is_acked(h):
    worker = h.worker(ready=10)
    client = h.client()
    schedule(client)
    assert client.commands() == [b"ACK"]
    assert len(worker.recv()) == 1
    h.advance(30, worker)
    runs = worker.recv()
    assert len(runs) == 3
    assert runs[0][4:6] == [b"default", b""]
    key = codec.schedule_hash(RUN).encode()
    assert key in h.broker.records[NAMESPACE]
    schedule(client, command=codec.UNSCHEDULE)
    assert client.commands() == [b"ACK"]
    h.advance(30, worker)
    assert worker.recv() == [] and h.broker.records[NAMESPACE] == {}


def test_nohaste_and_run_count_and_guarantee_for_runs(h):
    worker = h.worker(ready=10)
    schedule(h.client(), interval=b"5", headers=b"nohaste,run_count:2,guarantee")
    assert worker.recv() == []
    h.advance(20, worker)
    runs = worker.recv()
    assert len(runs) == 2
    assert runs[0][5] == b"guarantee,reply-requested"
    assert h.service.scheduler.jobs == {}


def test_cron_schedule_runs_on_the_minute(h):
    worker = h.worker(ready=10)
    schedule(h.client(), interval=b"-1", cron=b"* * * * *", headers=b"nohaste")
    job = next(iter(h.service.scheduler.jobs.values()))
    assert job.next_run % 60 == 0 and 0 < job.next_run - h.clock.seconds() <= 60
    h.advance(121, worker)
    assert len(worker.recv()) == 2


@pytest.mark.parametrize(
    ("interval", "cron", "payload"),
    [(b"0", b"", RUN), (b"-1", b"not cron", RUN), (b"-1", b"", RUN), (b"5", b"", b"[]")],
)
def test_bad_schedules_are_dropped(h, interval, cron, payload):
    client = h.client()
    schedule(client, interval=interval, cron=cron, payload=payload)
    assert client.recv() == [] and h.service.scheduler.jobs == {}


def test_schedules_survive_a_restart_through_broker_records(h):
    schedule(h.client(), interval=b"10")
    records = h.broker.records
    for router in h.routers():
        router.doStop()
    again = EMQPService(h.broker)
    for router in (again.frontend, again.backend, again.admin):
        router.doStart()
    assert list(again.scheduler.jobs) == [codec.schedule_hash(RUN)]
    assert records is h.broker.records


def test_external_schedulers_inform_and_send_requests(h):
    worker = h.worker(ready=1)
    scheduler = h.client(b"ext-sched")
    scheduler.send(codec.INFORM, b"", b"scheduler", msgid=b"si")
    [ack] = scheduler.recv()
    assert ack[2] == b"ACK" and ack[4] == b"si"
    request(scheduler, b"r1", headers=b"reply-requested")
    assert [m[3] for m in worker.recv()] == [b"r1"]


# -- pub/sub and other protocols ---------------------------------------------


def test_publish_reaches_queues_bound_to_the_topic(h):
    sink = RecordingSink()
    connection = h.broker.connection_opened("test", "peer", sink)
    h.broker.reconfigure(b"listener", add=[b"news.sports"])
    h.broker.consume(connection, b"c", b"listener", manual_ack=False)
    client = h.client()
    client.send(codec.PUBLISH, b"news.sports", b'{"score": 1}', msgid=b"p1")
    client.send(codec.PUBLISH, b"news.sports", b"csv", b"with headers", msgid=b"p2")
    client.send(codec.PUBLISH, b"nobody", b"x", msgid=b"p3")
    h.clock.advance(0)
    assert [(m.id, m.body, m.event) for _, m in sink.delivered] == [
        (b"p1", b'{"score": 1}', b"news.sports"), (b"p2", b"with headers", b"news.sports"),
    ]


def test_messages_from_other_protocols_reach_workers_with_empty_headers(h):
    worker = h.worker(queues=b'[[10, "jobs"]]', ready=1)
    h.broker.reconfigure(b"jobs", add=[b"job.created"])
    h.broker.publish_event(b"job.created", b"mqks-1", b"payload", None, None, "mqks")
    [forwarded] = worker.recv()
    assert forwarded == [b"", V, b"REQUEST", b"mqks-1", b"jobs", b"", b"payload"]


# -- admin and DISCONNECT ----------------------------------------------------


def test_admin_status_and_show_commands_answer_json(h):
    h.worker(b"\xff\xfebinary", b'[[10, "default"], [5, "email"]]', ready=2)
    request(h.client(), b"r1", queue=b"email", headers=b"guarantee")
    scheduler = h.client(b"sched")
    scheduler.send(codec.INFORM, b"", b"scheduler")
    admin = h.admin()
    answers = {}
    for command in (codec.STATUS, codec.SHOW_WORKERS, codec.SHOW_SCHEDULERS):
        admin.send(command, msgid=b"admin:1")
        [reply] = admin.recv()
        assert reply[2] == b"REPLY"
        answers[command] = json.loads(reply[4])
    status = answers[codec.STATUS]
    assert status["inflight_messages_by_queue"] == {"email": 1}
    assert status["processed_messages_by_worker"] == {"0xfffe62696e617279": 1}
    workers = answers[codec.SHOW_WORKERS]
    assert workers["connected_workers"]["0xfffe62696e617279"]["available_slots"] == 1
    assert workers["connected_queues"]["email"] == [[5, "0xfffe62696e617279"]]
    assert list(answers[codec.SHOW_SCHEDULERS]["connected_schedulers"]) == ["sched"]


def test_disconnect_drains_tracked_jobs_then_says_kbye_and_stops(h):
    worker = h.worker(ready=2)
    scheduler = h.client(b"sched")
    scheduler.send(codec.INFORM, b"", b"scheduler")
    scheduler.recv()
    client = h.client()
    request(client, b"g1", headers=b"guarantee")
    worker.recv()
    admin = h.admin()
    admin.send(codec.DISCONNECT, msgid=b"bye")
    [ack] = admin.recv()
    assert ack[2] == b"ACK" and ack[4] == b"bye"
    request(client, b"late")
    worker.send(codec.READY)
    assert worker.recv() == [] and h.stopped == []
    assert b"default" in h.broker.queues and h.broker.ready_count() == 0
    worker.send(codec.REPLY, b'{"value": 1}', b"g1")
    assert worker.commands() == [b"KBYE"]
    assert scheduler.commands() == [b"KBYE"]
    assert h.stopped == [] and worker.transport.disconnecting
    for peer in (worker, scheduler, client, admin):
        peer.lose()
    assert h.stopped == [True]


def test_disconnect_stores_what_does_not_finish_in_time(h):
    worker = h.worker(ready=1)
    request(h.client(), b"g1", headers=b"guarantee,retry-count:0")
    worker.recv()
    h.admin().send(codec.DISCONNECT)
    h.advance(10, worker)
    assert worker.commands() == [b"KBYE"]
    [message] = h.broker.queues[b"default"].ready
    assert (message.id, message.retry) == (b"g1", 0)


def test_disconnect_does_not_wait_for_untracked_requests(h):
    worker = h.worker(ready=1)
    admin = h.admin()
    client = h.client()
    client.protocol.dataReceived(zmtp.encode_message(
        [b"", V, codec.REQUEST, b"fire-and-forget", b"default", b"", RUN]
    ))
    # delivered at the end of the run, and settled as it was sent (its write
    # waits for the end of the reactor turn)
    assert h.broker.in_flight() == 0 and h.broker.ready_count() == 0
    [consumer] = h.broker.queues[b"default"].consumers
    assert (consumer.delivered, consumer.acked) == (1, 1)
    admin.protocol.dataReceived(zmtp.encode_message([b"", V, codec.DISCONNECT, b"d"]))
    assert [m[2] for m in worker.recv()] == [b"REQUEST", b"KBYE"]
    assert h.broker.ready_count() == 0 and h.broker.in_flight() == 0


def test_shutdown_says_kbye_and_requeues_jobs_without_using_a_retry(h):
    """SIGTERM stops the listeners; when the last eMQP socket stops, peers hear KBYE."""
    worker = h.worker(ready=1)
    scheduler = h.client(b"sched")
    scheduler.send(codec.INFORM, b"", b"scheduler")
    scheduler.recv()
    request(h.client(), b"g1", headers=b"guarantee,retry-count:0")
    assert [m[2] for m in worker.recv()] == [b"REQUEST"]
    routers = h.routers()
    for router in routers[:-1]:
        router.doStop()
    assert worker.recv() == []  # one socket still listens: not a shutdown yet
    routers[-1].doStop()
    assert worker.commands() == [b"KBYE"] and scheduler.commands() == [b"KBYE"]
    assert worker.transport.disconnecting and scheduler.transport.disconnecting
    [message] = h.broker.queues[b"default"].ready
    assert (message.id, message.retry) == (b"g1", 0)
    assert h.service.workers == {} and h.stopped == []


def test_disconnect_is_only_for_the_admin_socket(h):
    worker = h.worker()
    worker.send(codec.DISCONNECT)
    h.client().send(codec.DISCONNECT)
    assert not h.service.draining and b"w1" in h.service.workers


# -- malformed input ---------------------------------------------------------


@pytest.mark.parametrize(
    "frames",
    [
        [b"only"],
        [b"not empty", V, b"READY", b"m"],
        [b"", V, b"NOPE", b"m"],
        [b"", V, b"REQUEST", b"m"],
        [b"", V, b"REQUEST", b"m", b"q", b"timeout:x", b"{}"],
        [b"", V, b"REPLY", b"m", b"only-result"],
        [b"", V, b"PUBLISH", b"m", b""],
        [b"", V, b"SCHEDULE", b"m", b"q"],
        [b"", V, b"INFORM", b"m", b"", b"worker"],
    ],
)
def test_malformed_messages_are_dropped_and_nothing_breaks(h, frames):
    worker = h.worker(ready=1)
    for router in h.routers():
        peer = Peer(h, router, b"\xff\x00\xfe")
        peer.send_frames(frames)
    client = h.client()
    request(client, b"still-works")
    assert [m[3] for m in worker.recv()] == [b"still-works"]


def test_commands_from_unknown_workers_are_dropped(h):
    stranger = Peer(h, h.service.backend, b"stranger")
    stranger.send(codec.READY)
    stranger.send(codec.REPLY, b"{}", b"x")
    assert stranger.recv() == [] and h.service.workers == {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    identity=st.binary(min_size=1, max_size=20),
    command=st.sampled_from([b"INFORM", b"READY", b"REPLY", b"REQUEST", b"SCHEDULE",
                             b"UNSCHEDULE", b"PUBLISH", b"HEARTBEAT", b"KBYE", b"STATUS",
                             b"ROUTER_SHOW_WORKERS", b"X"]),
    body=st.lists(st.binary(max_size=30), max_size=6),
    which=st.integers(0, 2),
)
def test_any_binary_input_never_crashes(identity, command, body, which):
    h = Harness()
    peer = Peer(h, h.routers()[which], identity)
    peer.send_frames([b"", V, command, b"m", *body])
    peer.recv()
    worker = h.worker(b"check", ready=2)  # a valid fuzzed REQUEST may come first
    request(h.client(), b"ok")
    assert b"ok" in [m[3] for m in worker.recv()]


# -- overload: slow peers, full queues, the memory alarm ----------------------


def test_a_worker_that_does_not_read_is_handed_nothing_until_it_drains(h):
    worker = h.worker(b"w1", ready=5)
    worker.protocol.pauseProducing()  # its transport's buffer passed the high-water mark
    assert worker.protocol.paused
    client = h.client()
    for n in range(3):
        request(client, b"r%d" % n)
    assert worker.recv() == [] and len(h.broker.queues[b"default"].ready) == 3
    worker.protocol.resumeProducing()
    assert [m[3] for m in worker.recv()] == [b"r0", b"r1", b"r2"]


def test_a_worker_informing_again_while_paused_stays_paused(h):
    worker = h.worker(b"w1")
    worker.protocol.pauseProducing()
    worker.send(codec.INFORM, b"", b"worker", msgid=b"again")
    worker.send(codec.READY)
    request(h.client(), b"r0")
    assert worker.commands() == [b"ACK"]  # answers still go out; requests wait
    worker.protocol.resumeProducing()
    assert [m[3] for m in worker.recv()] == [b"r0"]


def test_a_client_that_does_not_read_its_answers_is_not_read(h):
    client = h.client()
    client.protocol.pauseProducing()
    assert client.transport.producerState == "paused"
    client.protocol.pause_reading()  # the memory alarm as well: both must end
    client.protocol.resumeProducing()
    assert client.transport.producerState == "paused"
    client.protocol.resume_reading()
    assert client.transport.producerState == "producing"


def test_a_request_to_a_full_queue_gets_an_error(h):
    h.broker.declare_queue(b"default", QueueOptions(max_length=1, overflow="reject-publish"))
    client = h.client()
    request(client, b"r0")
    request(client, b"r1")
    answers = client.recv()
    assert answers[0][2] == b"REPLY" and answers[0][4:] == [b"r0"]
    assert answers[1][2] == b"ERROR" and answers[1][4:6] == [b"r1", b"QueueFull"]
    client.send(codec.PUBLISH, b"topic", b"x", msgid=b"p1")
    h.broker.reconfigure(b"default", add=[b"topic"])
    client.send(codec.PUBLISH, b"topic", b"x", msgid=b"p2")
    assert [(m[2], m[4]) for m in client.recv()] == [(b"ERROR", b"p2")]


class GatedStore(MemoryStore):
    """A durable store whose batches stay unapplied until the test fires them."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[Deferred[None]] = []

    def apply(self, ops) -> Deferred[None]:
        gate: Deferred[None] = Deferred()
        self.gates.append(gate)
        return gate


def _counting_writes(peer: Peer) -> list[bytes]:
    """Every ``transport.write`` of ``peer``'s connection from now on."""
    writes: list[bytes] = []
    write = peer.transport.write
    peer.transport.write = lambda data: (writes.append(data), write(data))[1]
    return writes


def _durable_harness() -> tuple[Harness, GatedStore, list[int]]:
    """A harness on a ``GatedStore``, with a count of the broker's durability waits."""
    store = GatedStore()
    h = Harness(store)
    waits = [0]
    wait = h.broker.writer.wait

    def counted() -> Deferred[None]:
        waits[0] += 1
        return wait()

    h.broker.writer.wait = counted
    return h, store, waits


def _requests(msgids: list[bytes], queue: bytes = b"default") -> bytes:
    return b"".join(zmtp.encode_message([b"", V, codec.REQUEST, m, queue, b"", b"x"])
                    for m in msgids)


def test_a_run_of_requests_on_a_durable_store_is_answered_after_one_wait_in_one_write():
    h, store, waits = _durable_harness()
    client = h.client()
    writes = _counting_writes(client)
    msgids = [b"r%d" % n for n in range(1000)]
    client.protocol.dataReceived(_requests(msgids))
    h.clock.advance(0)
    assert waits == [1] and len(store.gates) == 1  # one wait, one batch, for the run
    assert client.recv() == [] and writes == []  # nothing before the run is durable
    store.gates[0].callback(None)
    answers = client.recv()
    assert len(writes) == 1  # every answer in one write
    assert [(a[2], a[4]) for a in answers] == [(codec.REPLY, m) for m in msgids]
    assert [m.id for m in h.broker.queues[b"default"].ready] == msgids


def test_a_run_of_requests_on_a_memory_store_is_answered_at_once_in_one_write(h):
    client = h.client()
    writes = _counting_writes(client)
    msgids = [b"r%d" % n for n in range(1000)]
    client.protocol.dataReceived(_requests(msgids))
    assert len(writes) == 1  # in the chunk's own write, without a reactor turn
    assert [(a[2], a[4]) for a in client.recv()] == [(codec.REPLY, m) for m in msgids]


def test_a_durable_run_keeps_refusals_in_their_place_among_the_accepts():
    h, store, waits = _durable_harness()
    h.broker.declare_queue(b"default", QueueOptions(max_length=2, overflow="reject-publish"))
    h.worker(queues=b'[[1, "x"]]')  # x is known: its requests are stored in it
    h.clock.advance(0)
    store.gates.pop().callback(None)  # the batch that declared it
    client = h.client()
    # another queue between: a run is cut where the queue changes, the wait is not
    client.protocol.dataReceived(_requests([b"r0", b"r1", b"r2"]) + _requests([b"s0"], b"x")
                                 + _requests([b"r3"]))
    h.clock.advance(0)
    assert waits == [1] and client.recv() == []
    store.gates.pop().callback(None)
    assert [(a[2], a[4]) for a in client.recv()] == [
        (codec.REPLY, b"r0"), (codec.REPLY, b"r1"), (codec.ERROR, b"r2"),
        (codec.REPLY, b"s0"), (codec.ERROR, b"r3"),
    ]


def test_a_failed_batch_sends_no_accept():
    h, store, _ = _durable_harness()
    client = h.client()
    with capturedLogs() as events:
        client.protocol.dataReceived(_requests([b"r0", b"r1"]))
        h.clock.advance(0)
        store.gates[0].errback(OSError("disk full"))
    assert client.recv() == []
    assert any("storing a request failed; no answer sent" in formatEvent(e) for e in events)


def test_clients_that_publish_are_paused_by_the_memory_alarm(h):
    usage = [0]
    h.broker.flow.measure = lambda: usage[0]
    h.broker.flow.configure(100)
    h.broker.flow.start()
    client, idle = h.client(), h.client(b"idle")
    request(client, b"r0")
    usage[0] = 200
    h.clock.advance(1)
    assert client.transport.producerState == "paused"
    assert idle.transport.producerState == "producing"
    usage[0] = 0
    h.clock.advance(1)
    assert client.transport.producerState == "producing"


# -- fast paths: each must answer, store and log exactly as the long way -------


def _long_way(h: Harness, router) -> None:
    """Make ``router``'s handler take every message one at a time (``message_received``)."""
    handler = router.handler
    handler.handle_run = partial(EndpointHandler.handle_run, handler)


def _outcome(h: Harness, peer: Peer, chunk: bytes) -> tuple:
    """What one chunk from ``peer`` led to: answers (their fresh msgids blanked),
    stored messages, log lines and scheduler liveness."""
    with capturedLogs() as events:
        peer.protocol.dataReceived(chunk)
        h.clock.advance(0)
    answers = [[*m[:3], b"?", *m[4:]] for m in peer.recv()]
    stored = {
        name: [(m.id, m.body, m.headers) for m in queue.ready]
        for name, queue in h.broker.queues.items()
    }
    scheduler = h.service.schedulers.get(peer.identity)
    return (answers, stored, [formatEvent(e) for e in events],
            scheduler.last_seen if scheduler else None, peer.transport.disconnecting)


def _twins(**options) -> tuple[Harness, Harness]:
    fast, slow = Harness(**options), Harness(**options)
    _long_way(slow, slow.service.frontend)
    _long_way(slow, slow.service.backend)
    return fast, slow


class DurableNow:
    """A store writer that keeps nothing: ``broker.durable`` fires at once."""

    # never far behind (StoreWriter.behind_at: the broker checks it after a run)
    behind_at = 1 << 62
    is_behind = False

    def __init__(self) -> None:
        self.ops: list = []

    def add(self, op) -> None:
        self.ops.append(op)

    def wait(self) -> Deferred[None]:
        return succeed(None)


SMALL = Limits(max_name=8, max_id=6, max_headers=2)
_REQUESTISH = st.one_of(
    st.just([b"", V, codec.REQUEST, b"m1", b"q", b"", b"x"]),
    st.just([b"", V, codec.INFORM, b"i", b"", codec.SCHEDULER]),  # answered ACK in between
    st.tuples(
        st.sampled_from([b"", b"", b"", b"x"]),
        st.sampled_from([codec.REQUEST, codec.REQUEST, b"request", codec.HEARTBEAT, codec.KBYE]),
        st.sampled_from([b"m1", b"m2", b"", b"m\n", b"m" * 7]),
        st.sampled_from([b"default", b"q", b"", b"q\x00", b"q" * 9]),
        st.sampled_from([b"", b"", b"guarantee", b"timeout:x", b"a,b,c", b"reply-requested"]),
        st.binary(max_size=3),
        st.sampled_from([7, 7, 7, 4, 5, 6, 8]),  # frames
    ).map(lambda t: [t[0], V, t[1], t[2], t[3], t[4], t[5], b"extra"][: t[6]]),
)


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(_REQUESTISH, max_size=8),
    full=st.booleans(),
    scheduler=st.booleans(),
    durable_answer=st.booleans(),
    worker=st.booleans(),
)
def test_the_request_fast_path_agrees_with_the_long_way(messages, full, scheduler,
                                                         durable_answer, worker):
    """Runs of requests stored together (to ``default``, or to ``q`` once a
    worker knows it, each full at 2 with reject-publish), cut by other
    messages, refusals, redirections and bad requests, answer as one by one."""
    outcomes = []
    for h in _twins(limits=SMALL):
        if full:
            for name in (b"default", b"q"):
                h.broker.declare_queue(name, QueueOptions(max_length=2,
                                                          overflow="reject-publish"))
        if worker:  # q is known: its requests are stored in it, without a slot to leave
            Peer(h, h.service.backend, b"w1").send(codec.INFORM, b'[[1, "q"]]', b"worker",
                                                   msgid=b"i")
            assert h.broker.queues[b"q"].consumers
        client = h.client()
        if scheduler:
            client.send(codec.INFORM, b"", codec.SCHEDULER)
            client.recv()
            h.clock.advance(1)
        if durable_answer:  # a writer: answers wait for broker.durable()
            h.broker.writer = DurableNow()
        outcomes.append(_outcome(h, client, b"".join(map(zmtp.encode_message, messages))))
    assert outcomes[0] == outcomes[1]


def test_requests_while_draining_are_refused_the_long_way(h):
    h.worker(ready=0)
    request(h.client(b"early"), b"r0", headers=b"guarantee")
    h.service.disconnect()
    client = h.client()
    with capturedLogs() as events:
        client.protocol.dataReceived(zmtp.encode_message([b"", V, codec.REQUEST, b"r1",
                                                          b"default", b"", b"x"]))
    assert client.recv() == []
    assert [m.id for m in h.broker.queues[b"default"].ready] == [b"r0"]
    assert any("draining after DISCONNECT; REQUEST b'r1' refused" in formatEvent(e)
               for e in events)


_WORKERISH = st.one_of(
    st.just([b"", V, codec.READY, b"r"]),  # the common READY
    st.tuples(
        st.sampled_from([b"", b"", b"", b"x"]),
        st.sampled_from([codec.READY, codec.READY, codec.READY, b"ready", codec.HEARTBEAT]),
        st.sampled_from([b"r", b"r", b"r2", b"", b"m\n", b"m" * 7]),
        st.sampled_from([4, 4, 4, 3, 5]),  # frames
    ).map(lambda t: [t[0], V, t[1], t[2], b"extra"][: t[3]]),
    st.sampled_from([
        [b"", V, codec.KBYE, b"k"],
        [b"", V, codec.INFORM, b"i", b"", b"worker"],
        [b"", V, codec.REPLY, b"p", b"{}", b"q1"],
    ]),
)


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(_WORKERISH, max_size=8),
    known=st.sampled_from([True, True, False]),
    draining=st.booleans(),
)
def test_the_ready_fast_path_agrees_with_the_long_way(messages, known, draining):
    outcomes = []
    for h in _twins(limits=SMALL):
        client = h.client()
        for n in range(5):
            request(client, b"q%d" % n, headers=b"" if n % 2 else b"guarantee")
        worker = Peer(h, h.service.backend, b"w1")
        if known:
            worker.send(codec.INFORM, b"", codec.WORKER, msgid=b"i")
            worker.send(codec.READY, msgid=b"r")  # q0 in flight: a drain waits for it
            worker.recv()
        if draining:
            h.service.disconnect()
        h.clock.advance(1)
        outcome = _outcome(h, worker, b"".join(map(zmtp.encode_message, messages)))
        registered = h.service.workers.get(b"w1")
        outcomes.append((outcome, registered and (registered.slots.free, registered.last_seen)))
    assert outcomes[0] == outcomes[1]


def test_readies_get_their_requests_in_the_write_that_ends_the_chunk(h):
    client = h.client()
    for n in range(3):
        request(client, b"r%d" % n)
    worker = h.worker()
    writes = []
    worker.transport.write = writes.append  # what one dataReceived writes, before any timer
    ready = zmtp.encode_message([b"", V, codec.READY, b"r"])
    worker.protocol.dataReceived(ready * 2)
    [data] = writes
    delivered = MessageDecoder(2**20, 64).feed(data)
    assert [m[3] for m in delivered] == [b"r0", b"r1"]
