"""HTTP client of the crash test: set-up, durable publishes with headers and TTLs, purge.

Publishes ask ``"durable": true``, so their 201 says they are durable; a
third of those to a queue are batches of two to five (one request, one
broker run, one durability wait), whose 201 says every one of them is.  A
purge is answered once applied, not once durable: a barrier
(``mqks.Barrier``) makes it so.  It drops every copy of ``u`` whose publish
was confirmed before the purge was sent; copies published while it was in
flight may or may not have been dropped.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from typing import Any

from mqserver.crashtest.ledger import DURABLE, NONE, Ledger
from mqserver.crashtest.mqks import body_of
from mqserver.crashtest.server import TOKEN
from mqserver.crashtest.topology import QUEUES, dead_letter


class Client:
    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.connection.request(method, path, json.dumps(body or {}), headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status not in (200, 201):
            raise RuntimeError(f"{method} {path}: {response.status} {data!r}")
        return json.loads(data)

    def declare(self) -> None:
        for name, options in QUEUES.items():
            self.call("PUT", f"/api/queues/{name}", options)


class Publisher:
    """Publishes to ``r``, ``r0``, ``p`` (with ``x-max-retries``) and ``tev`` (with a TTL);
    with ``purges``, purges ``u`` every tenth request."""

    def __init__(self, port: int, ledger: Ledger, rng: random.Random, prefix: str,
                 purges: bool) -> None:
        self.client = Client(port)
        self.purges = purges
        self.ledger = ledger
        self.rng = rng
        self.prefix = prefix

    def run(self, stop: threading.Event) -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                if self.purges and n % 10 == 0:
                    self._purge()
                else:
                    self._publish(f"{self.prefix}{n}")
        except (OSError, http.client.HTTPException, RuntimeError):
            return  # the kill

    def _publish(self, mid: str) -> None:
        ledger, rng = self.ledger, self.rng
        body: dict[str, Any] = {"id": mid, "body": body_of(mid).decode(), "durable": True}
        payload: Any = body
        with ledger.lock:
            now = time.time()
            if rng.random() < 0.25:
                ttl = rng.choice((0.5, 600.0))
                body["ttl"] = ttl
                path = "/api/events/tev"
                copies = [ledger.publish(mid, "t", "t.dead", now, ttl),
                          ledger.publish(mid, "t0", None, now, ttl)]
            else:
                queue = rng.choice(("r", "r0", "p"))
                limit = rng.choice((0, 1, 2))
                body["headers"] = {"x-max-retries": str(limit)}
                path = f"/api/queues/{queue}/messages"
                messages = [body]
                if rng.random() < 1 / 3:  # a batch: one request, one run, one durability wait
                    path += "/batch"
                    more = [f"{mid}b{n}" for n in range(rng.randint(1, 4))]
                    messages += [{**body, "id": m, "body": body_of(m).decode()} for m in more]
                    payload = messages
                copies = [ledger.publish(m["id"], queue, dead_letter(queue), now) for m in messages]
                for copy in copies:
                    copy.limit = limit
        self.client.call("POST", path, payload)
        with ledger.lock:
            for copy in copies:
                copy.confirmed_at = time.time()
                ledger.confirm(copy.ops[0])

    def _purge(self) -> None:
        ledger = self.ledger
        with ledger.lock:
            ledger.purging += 1
            ops, left = [], []
            for copy in ledger.by_home.get("u", ()):
                if copy.ops[0].state == DURABLE:
                    ops.append(ledger.settle(copy, "purge", NONE))
                else:
                    ledger.settle(copy, "purge?", NONE)  # never known: stays a "may"
                    left.append(copy)
            ledger.by_home["u"] = left
        self.client.call("POST", "/api/queues/u/purge")
        with ledger.lock:
            ledger.purging -= 1
            for op in ops:
                ledger.applied(op)
