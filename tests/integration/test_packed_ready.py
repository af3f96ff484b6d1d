"""--pack-ready-after end to end: a packed backlog goes out whole and in order, across a restart."""

from __future__ import annotations

import pytest

COUNT = 3000  # about three chunks past the threshold


@pytest.mark.parametrize("storage", ["memory", "log", "sqlite"])
def test_a_packed_backlog_is_delivered_in_order(packed_backlog, start_server, line_client,
                                                tmp_path, storage):
    server, args = packed_backlog(storage, tmp_path / "data", COUNT)
    if storage != "memory":
        # recovered messages come back packed (the store's Backlog); later
        # ones join the packed queue's tail
        server.stop()
        server = start_server(*args)
        producer = line_client(server.ports["mqks"])
        producer.send(*[f"m{n} publish e body {n}" for n in range(COUNT, COUNT + 300)],
                      "s publish --confirm nobody x")
        assert producer.read(1) == [b"s ok "]
    total = COUNT + (300 if storage != "memory" else 0)
    consumer = line_client(server.ports["mqks"])
    consumer.send("c consume --confirm q e")
    assert consumer.read(1) == [b"c ok "]
    assert consumer.read(total, timeout=60) == [
        f"c ok m{n} event=e body {n}".encode() for n in range(total)
    ]
