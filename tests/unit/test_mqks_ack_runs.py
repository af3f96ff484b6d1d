"""MQKS ack runs (issue 8): where a chunk's run of acks is settled, and which acks join it.

The twin property test in test_mqks_runs.py compares chunks mixing acks,
publishes and every other line with a server that handles each line on its
own; these tests pin each place a run of acks must be stored.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs

from mqserver.broker.core import Broker
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.storage.memory import MemoryStore

EID = re.compile(rb"\d{20}[0-9a-zA-Z]{4}")


class Probe:
    """A consumer ``c`` holding m1 to m4 (and ``d`` holding n1, n2) on a connection
    whose broker records, in order, its runs, its single acks and its pumps."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.broker = broker = Broker(MemoryStore(), self.clock)
        self.factory = MQKSFactory(broker, max_line=60)
        self.protocol, self.transport = self.connect()
        self.send(b"c consume --manual-ack q ea", b"d consume --manual-ack r eb")
        self.send(*(b"m%d publish ea x" % n for n in range(1, 5)), b"n1 publish eb y",
                  b"n2 publish eb y")
        self.calls: list[Any] = []
        for name in ("ack_run", "ack", "publish_event_run", "pump_now"):
            self._record(name)

    def connect(self) -> tuple[Any, StringTransport]:
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        protocol.makeConnection(transport)
        return protocol, transport

    def _record(self, name: str) -> None:
        method = getattr(self.broker, name)

        def call(*args: Any) -> Any:
            if name == "ack_run":
                self.calls.append((name, args[0].id, list(args[1])))
            elif name == "ack":
                self.calls.append((name, args[0].id, args[1]))
            elif name == "publish_event_run":
                self.calls.append((name, [rid for rid, _ in args[1]]))
            else:
                self.calls.append((name,))
            return method(*args)

        setattr(self.broker, name, call)

    def send(self, *lines: bytes) -> list[bytes]:
        return self.feed(b"".join(line + b"\n" for line in lines))

    def feed(self, *chunks: bytes) -> list[bytes]:
        """The lines the client got for ``chunks``, each received on its own (ids masked)."""
        for chunk in chunks:
            self.protocol.dataReceived(chunk)
        self.clock.advance(0)
        out, _ = EID.subn(b"EID", self.transport.value())
        self.transport.clear()
        return out.splitlines()

    def runs(self) -> list[Any]:
        return [call for call in self.calls if call[0] != "pump_now"]


@pytest.fixture
def probe() -> Probe:
    return Probe()


def test_a_chunks_acks_of_one_consumer_are_one_run_before_its_pump(probe):
    assert probe.send(b"a ack c m1", b"a ack c m2", b"a ack c nope", b"a ack c m2") == []
    assert probe.calls == [("ack_run", b"c", [b"m1", b"m2", b"nope", b"m2"]), ("pump_now",)]
    assert list(probe.factory.consumers[b"c"].unacked) == [b"m3", b"m4"]


def test_another_consumer_starts_another_run(probe):
    probe.send(b"a ack c m1", b"a ack d n1", b"a ack d n2", b"a ack c m2")
    assert probe.runs() == [("ack_run", b"c", [b"m1"]), ("ack_run", b"d", [b"n1", b"n2"]),
                            ("ack_run", b"c", [b"m2"])]


def test_publishes_and_acks_are_stored_in_the_order_they_came(probe):
    probe.send(b"p1 publish ea x", b"a ack c m1", b"a ack c m2", b"p2 publish ea x",
               b"p3 publish ea x", b"a ack c m3")
    assert probe.runs() == [("publish_event_run", [b"p1"]), ("ack_run", b"c", [b"m1", b"m2"]),
                            ("publish_event_run", [b"p2", b"p3"]), ("ack_run", b"c", [b"m3"])]


def test_any_other_line_sees_the_acks_before_it_settled(probe):
    out = probe.send(b"a ack c m1", b"a ack c m2",
                     b"e _eval len(state.messages_by_consumer_ids['c'])")
    assert out == [b"e ok 2"]


@pytest.mark.parametrize("line", [
    b"a ack --confirm c m2",  # a confirm: answered
    b"a ack c --all",
    b"a ack c m-2",  # an unusual id: checked where no message has it
    b"a-1 ack c m2",  # an unusual request id: checked
])
def test_an_ack_that_answers_or_checks_goes_alone_after_the_run(probe, line):
    out = probe.send(b"a ack c m1", line, b"a ack c m3")
    assert out == ([b"a ok "] if b"--confirm" in line else [])
    runs = [call for call in probe.runs() if call[0] == "ack_run"]
    assert runs == [("ack_run", b"c", [b"m1"]), ("ack_run", b"c", [b"m3"])]


def test_an_error_comes_after_the_acks_before_it(probe):
    out = probe.send(b"a ack c m1", b"b ack c m\x01", b"a ack c m2",
                     b"e _eval len(state.messages_by_consumer_ids['c'])")
    assert out == [b"b error EID", b"e ok 2"]
    assert probe.runs() == [("ack_run", b"c", [b"m1"]), ("ack", b"c", b"m\x01"),
                            ("ack_run", b"c", [b"m2"])]


def test_an_unknown_consumers_acks_go_one_at_a_time(probe):
    assert probe.send(b"a ack zz m1", b"a ack zz m\x01") == [b"a error EID"]
    assert probe.runs() == []  # not even a broker call: no consumer


def test_a_flags_name_is_never_taken_for_a_runs_consumer(probe):
    probe.send(b"--confirm consume --manual-ack q ea")
    out = probe.send(b"a ack c m1", b"a ack --confirm m2")
    assert out == [b"a error EID"]  # "--confirm m2": no consumer id, as one at a time
    assert probe.runs() == [("ack_run", b"c", [b"m1"])]


def test_a_consumer_gone_since_it_was_named_is_not_looked_up_again(probe):
    other, _ = probe.connect()
    other.dataReceived(b"x delete_queue q\n")
    assert probe.send(b"a ack c m1", b"a ack c m2") == [b"c ok --update q --manual-ack"]
    assert probe.runs() == []
    assert b"c" not in probe.factory.consumers


def test_a_too_long_line_is_answered_after_the_run(probe):
    errors: list[bytes] = []
    error = probe.protocol._error

    def record(request_id: bytes, text: str) -> None:
        errors.append(request_id)
        probe.calls.append(("error", request_id))
        error(request_id, text)

    probe.protocol._error = record
    probe.protocol.dataReceived(b"a ack c m1\na ack c m2\n" + b"w" * 70 + b"\n")
    assert probe.calls[:2] == [("ack_run", b"c", [b"m1", b"m2"]), ("error", b"None")]
    assert errors == [b"None"]


def test_a_line_left_at_the_chunks_end_waits_for_the_next_chunk(probe):
    probe.feed(b"a ack c m1\na ack c m", b"2\n")
    assert probe.runs() == [("ack_run", b"c", [b"m1"]), ("ack_run", b"c", [b"m2"])]


def test_a_run_that_fails_unexpectedly_answers_each_of_its_lines_with_an_error(probe):
    probe.broker.ack_run = lambda consumer, message_ids: 1 / 0
    with capturedLogs() as events:
        out = probe.send(b"a1 ack c m1", b"a2 ack c m2", b"p ping after")
    failures = [e["log_failure"].type for e in events if "log_failure" in e]
    # one failure logged for the run, where one at a time logs one per line
    assert (out, failures) == ([b"a1 error EID", b"a2 error EID", b"p ok after"],
                               [ZeroDivisionError])
