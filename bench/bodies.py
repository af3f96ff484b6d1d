"""W1 with large bodies: 64 KiB and 1 MiB messages, in memory and on a durable store.

The suite's W1 (``bench.workloads.w1``) with the suite's clients, but
sized by bytes: a round moves ``total`` bytes of bodies, so it holds
``total / size`` messages, and the producer writes ``WRITE`` bytes of
messages at a time instead of 1000 messages (a 1000-message chunk of 1 MiB
bodies would be a 1 GB ``sendall``).  Every protocol's own limit is above
both sizes: MQKS ``--mqks-max-line`` and PHPMQ ``--phpmq-max-content``
16 MiB, HTTP ``--http-max-body`` 16 MiB (one request per message), eMQP
``--emqp-max-message`` 64 MiB (left out: its client, not the server, is
what W1 measures there).  HTTP's long poll returns its messages' bodies
in one JSON response, so its consumer asks for ``POLL_BYTES`` of them at a
time instead of 1000 messages (``http_client``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from bench.clients.http import HTTPClient
from bench.proc import Server
from bench.workloads import ClientFactory, w1

SIZES = {"64KiB": 64 * 1024, "1MiB": 1024 * 1024}
WRITE = 1024 * 1024  #: bytes of messages per producer write
POLL_BYTES = 4 * 1024 * 1024  #: bytes of bodies an HTTP long poll asks for
HTTP_SHARE = 0.25  #: share of the bytes HTTP moves (a request per message, as in W1)


def http_client(size: int) -> type[HTTPClient]:
    """The HTTP client with long polls of ``POLL_BYTES`` of ``size``-byte bodies."""

    class HTTPBodies(HTTPClient):
        window: ClassVar[int] = max(1, POLL_BYTES // size)

    return HTTPBodies


def large(make: ClientFactory, server: Server, queue: str, total: int,
          size: int) -> dict[str, Any]:
    """One W1 round of ``total`` bytes in bodies of ``size`` bytes."""
    count = max(1, total // size)
    result = w1(make, server, queue, count, size, per_write=max(1, WRITE // size))
    result["size"] = size
    return result
