"""The PHPMQ plugin descriptor: its options reach the factory through tap.Options."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mqserver import tap
from mqserver.broker.core import Broker
from mqserver.plugins import phpmq
from mqserver.storage.memory import MemoryStore


def parse(*args: str) -> tap.Options:
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def test_defaults():
    options = parse()
    assert ("phpmq", "tcp:9100:interface=127.0.0.1") in options["protocols"]
    factory = phpmq.build_factory(Broker(MemoryStore(), Clock()), options)
    assert (factory.max_content, factory.dead_letter_suffix, factory.revision) == (
        16 * 1024 * 1024, b"", None,
    )


def test_options_reach_the_factory():
    options = parse(
        "--protocol=phpmq", "--phpmq-max-content=100", "--phpmq-dead-letter-suffix=.dead",
        "--phpmq-revision=2018",
    )
    factory = phpmq.build_factory(Broker(MemoryStore(), Clock()), options)
    assert (factory.max_content, factory.dead_letter_suffix, factory.revision) == (
        100, b".dead", 2018,
    )
    assert phpmq.build_factory(factory.broker, parse("--phpmq-revision=2017")).revision == 2017


def test_bad_revision_is_a_usage_error():
    with pytest.raises(usage.UsageError, match="phpmq-revision"):
        parse("--phpmq-revision=2019")


def test_help_documents_the_options():
    text = str(tap.Options())
    for flag in ("--phpmq-max-content", "--phpmq-dead-letter-suffix", "--phpmq-revision"):
        assert flag in text


def test_make_service_listens_on_the_phpmq_endpoint():
    reactor = MemoryReactorClock()
    options = parse("--protocol", "phpmq:tcp:4322:interface=127.0.0.1", "--no-gc-tuning",
                    "--no-http", "--storage=memory")
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    [(port, factory, _backlog, interface)] = reactor.tcpServers
    assert (port, interface) == (4322, "127.0.0.1")
    assert type(factory.wrappedFactory).__name__ == "PHPMQFactory"  # behind the limits
    assert service.stopService().called
