"""The HTTP face of the broker: JSON API, Prometheus metrics and a dashboard.

It talks to the broker only through its public API (``mqserver.broker`` never
imports twisted.web).  ``mqserver.web.app.build_site`` makes the site that
``twistd mqserver --http ENDPOINT`` listens with; importing this package
itself stays cheap, because ``mqserver.tap`` reads the token file through it
while options are parsed.
"""

from __future__ import annotations

from pathlib import Path


def read_token(path: str, option: str = "--http-token-file") -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped).

    :raises ValueError: the file cannot be read or holds no token, so a typo
        in ``option`` (``--http-token-file``, ``--http-read-token-file``) stops
        start-up instead of leaving the API silently closed.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {option} {path!r}: {e}") from None
    if not token:
        raise ValueError(f"{option} {path!r} is empty")
    return token
