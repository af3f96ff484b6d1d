"""The eMQP plugin descriptor: options, its three listeners, one shared service per broker."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.python import usage

from mqserver import tap
from mqserver.broker.core import Broker
from mqserver.plugins import emqp, mqks, phpmq
from mqserver.storage.memory import MemoryStore


def parse(*args: str) -> tap.Options:
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def test_defaults_bind_the_original_ports_on_loopback():
    options = parse()
    assert ("emqp", "tcp:47291:interface=127.0.0.1") in options["protocols"]
    broker = Broker(MemoryStore(), Clock())
    frontend = emqp.build_factory(broker, options)
    extras = emqp.extra_listeners(broker, options)
    assert [(label, endpoint) for label, endpoint, _ in extras] == [
        ("emqp-backend", "tcp:47290:interface=127.0.0.1"),
        ("emqp-admin", "tcp:47293:interface=127.0.0.1"),
    ]
    service = extras[0][2].handler.service
    assert frontend.handler.service is service is extras[1][2].handler.service
    assert emqp.build_factory(broker, options) is frontend
    assert (service.heartbeat_interval, service.peer_timeout, service.dead_letter) == (3.0, 5.0, b"")
    other = Broker(MemoryStore(), Clock())
    assert emqp.build_factory(other, options).handler.service is not service


def test_options_reach_the_service():
    options = parse(
        "--protocol=emqp", "--emqp-backend=tcp:1", "--emqp-admin=tcp:2", "--emqp-heartbeat=1.5",
        "--emqp-peer-timeout=4", "--emqp-max-message=1000", "--emqp-dead-letter=dead",
        "--emqp-drain-timeout=2",
    )
    broker = Broker(MemoryStore(), Clock())
    service = emqp.build_factory(broker, options).handler.service
    assert [e for _, e, _ in emqp.extra_listeners(broker, options)] == ["tcp:1", "tcp:2"]
    assert (service.heartbeat_interval, service.peer_timeout, service.drain_timeout) == (1.5, 4, 2)
    assert service.dead_letter == b"dead" and service.backend.max_message_size == 1000


def test_bad_numbers_are_usage_errors():
    for arg in ("--emqp-heartbeat=often", "--emqp-max-message=big"):
        try:
            parse(arg)
        except usage.UsageError:
            continue
        raise AssertionError(f"{arg} was accepted")


def test_other_protocols_have_no_extra_listeners():
    broker = Broker(MemoryStore(), Clock())
    assert mqks.extra_listeners(broker, parse()) == []
    assert phpmq.extra_listeners(broker, parse()) == []
