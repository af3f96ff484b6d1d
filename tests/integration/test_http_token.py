"""The HTTP token never reaches the server's log, whatever requests carry it."""

from __future__ import annotations

import urllib.error
import urllib.request

TOKEN = "tok-7f3a9c1e5b"  # distinctive: any trace of it in the log is found


def call(port: int, method: str, path: str, auth: str | None, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_token_is_never_logged(start_server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_server("--storage=memory", f"--http-token-file={token_file}",
                          "--protocol=mqks:tcp:0:interface=127.0.0.1",
                          "--http=tcp:0:interface=127.0.0.1")
    port = server.ports["http"]
    right, wrong = f"Bearer {TOKEN}", f"Bearer {TOKEN}x"
    assert call(port, "POST", "/api/events/e", wrong, b'{"body": "x"}') == 401
    assert call(port, "POST", "/api/events/e", f"Basic {TOKEN}", b'{"body": "x"}') == 401
    assert call(port, "POST", "/api/events/e", right, b'{"body": "x"}') == 201
    assert call(port, "POST", "/api/events/e", right, b"{not json") == 400
    assert call(port, "PUT", f"/api/queues/{TOKEN}", wrong) == 401
    assert call(port, "GET", f"/api/nothing?token={TOKEN}", right) == 404
    assert server.stop() in (0, 143, -15)
    log = server.text()
    assert "http listening on" in log and "Main loop terminated." in log
    assert TOKEN not in log
