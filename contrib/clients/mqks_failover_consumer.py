#!/usr/bin/env python3
"""An MQKS consumer that survives a failover: reconnect, consume again, carry on.

What an MQKS client does against active/standby nodes (docs/ha.md): it knows
every node's address (or one load balancer's), and whenever its connection
drops or is refused it tries the next one after a short pause, then sends
its ``consume`` again.  Deliveries it had not acked come again from the new
active, so it acks by id and treats a repeat as already done.

    python3 mqks_failover_consumer.py QUEUE EVENT COUNT HOST:PORT [HOST:PORT ...]

Prints ``got ID`` for each first delivery and ``reconnected to HOST:PORT``
after each failover; exits 0 once COUNT distinct messages were acked, 1 if
none came for 60 s.
"""

from __future__ import annotations

import itertools
import sys
import time

from mqks_client import MQKS


def consume(queue: str, event: str, count: int, addresses: list[tuple[str, int]]) -> int:
    seen: set[str] = set()
    last_progress = time.monotonic()
    for n in itertools.count():
        if time.monotonic() - last_progress > 60:
            return 1
        host, port = addresses[n % len(addresses)]
        try:
            client = MQKS(host, port, timeout=5.0)
        except OSError:
            time.sleep(0.2)  # refused: a standby, or the active is gone
            continue
        if n:
            print(f"reconnected to {host}:{port}", flush=True)
        try:
            client.send(f"c{n} consume --confirm {queue} {event} --manual-ack")
            while len(seen) < count:
                words = client.read().split(" ", 4)
                if words[0] != f"c{n}" or words[1] != "ok" or len(words) < 5:
                    continue  # the consume's own ok, or an answer to an ack
                mid = words[2]
                client.send(f"a ack c{n} {mid}")
                if mid not in seen:
                    seen.add(mid)
                    last_progress = time.monotonic()
                    print(f"got {mid}", flush=True)
            client.close()
            return 0
        except OSError:  # ConnectionError and timeouts too
            client.close()
            time.sleep(0.2)
    return 1


if __name__ == "__main__":
    queue, event, count, *nodes = sys.argv[1:]
    hosts = [(node.rpartition(":")[0], int(node.rpartition(":")[2])) for node in nodes]
    sys.exit(consume(queue, event, int(count), hosts))
