"""Shared fixtures: a broker on a fake clock for unit tests."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker(clock: Clock) -> Broker:
    return Broker(MemoryStore(), clock)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
