"""The bearer token is compared in constant time, whatever the client sends."""

from __future__ import annotations

import hmac

import pytest

from mqserver.web import app


@pytest.mark.parametrize("sent", ["s3cret", "wrong", "s3cre", "s3cret-and-more", "ünïcode", ""])
def test_every_token_check_goes_through_compare_digest(web, monkeypatch, sent):
    """A plain ``==`` stops at the first differing byte and leaks the token's prefix by timing."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app.hmac, "compare_digest", recording)
    status, _ = web.request("PUT", "/api/queues/q", token=sent)
    assert compared == [(sent.encode(), b"s3cret")]
    assert (status < 300) if sent == "s3cret" else (status == 401)
