"""The bench's MQKS client with every publish confirmed (W1c), against the real server.

``flush`` must return only once each publish got its ``ok `` (none left
unanswered, none counted twice), and every message must come back.  No
timing assertions.
"""

from __future__ import annotations

import pytest

from bench.clients.mqks import MQKSClient
from bench.servers import start_mqserver
from bench.workloads import w1


class Kept(MQKSClient):
    """Kept for a look after the round."""

    made: list[Kept] = []

    def open(self) -> None:
        super().open()
        self.made.append(self)


@pytest.mark.parametrize("storage", ["memory", "log-interval"])
def test_every_publish_is_confirmed_and_comes_back(tmp_path, storage):
    Kept.made.clear()
    server = start_mqserver(storage, tmp_path)
    try:
        result = w1(Kept, server, "w1c", 3500, 100, confirm_each=True)
    finally:
        server.stop()
    assert result["received"] == 3500
    (client,) = Kept.made
    assert client.replies.sent == client.replies.answered == 3500
    assert client.replies.rest == b""


def test_each_line_asks_for_a_confirm_only_when_told():
    client = MQKSClient.__new__(MQKSClient)
    client.event = b"evq"
    assert client.encode([b"a", b"b"]) == (b"m0 publish evq a\nm1 publish evq b\n", 2)
    client.confirm_each = True
    assert client.encode([b"c"]) == (b"m2 publish --confirm evq c\n", 1)
