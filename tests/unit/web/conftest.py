"""A broker on a fake clock behind the HTTP API, driven in memory through treq's StubTreq."""

from __future__ import annotations

from typing import Any

import pytest
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mqserver.broker.core import Broker
from mqserver.client import HTTPClient
from mqserver.storage.memory import MemoryStore
from mqserver.web.app import build_site

TOKEN = "s3cret"


def result(d: Deferred) -> Any:
    """What ``d`` fired with (raising its failure); it must have fired."""
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


class Web:
    """``request`` returns (status, decoded body); ``start`` leaves a request pending."""

    def __init__(self, store: Any = None, token: str | None = TOKEN, max_body: int = 1000,
                 read_token: str | None = None):
        self.clock = Clock()
        self.broker = Broker(store or MemoryStore(), self.clock)
        self.site = build_site(self.broker, token=token, max_body=max_body,
                               read_token=read_token)
        self.api = self.site.api
        self.stub = StubTreq(self.site.resource)
        self.client = HTTPClient("http://mq.test", token=token, http=self.stub)

    def start(self, method: str, path: str, token: str | None = TOKEN, **kwargs: Any) -> Deferred:
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.stub.request(method, "http://mq.test" + path, headers=headers, **kwargs)

    def finish(self, d: Deferred) -> tuple[int, Any]:
        self.stub.flush()
        response = result(d)
        kind = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        reader = treq.json_content if kind.startswith(b"application/json") else treq.content
        return response.code, result(reader(response))

    @staticmethod
    def result(d: Deferred) -> Any:
        return result(d)

    def answered(self, d: Deferred) -> bool:
        """Whether the server has answered the request ``d`` (yet)."""
        self.stub.flush()
        seen: list[bool] = []
        d.addBoth(lambda r: seen.append(True) or r)
        return bool(seen)

    def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        return self.finish(self.start(method, path, **kwargs))

    def turn(self) -> None:
        """One reactor turn: dispatch, then the answers it caused."""
        self.clock.advance(0)
        self.clock.advance(0)
        self.stub.flush()


@pytest.fixture
def web() -> Web:
    return Web()


@pytest.fixture
def make_web() -> type[Web]:
    """``make_web(store=..., token=..., max_body=..., read_token=...)`` for a non-default setup."""
    return Web
