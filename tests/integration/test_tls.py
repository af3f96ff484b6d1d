"""TLS on every listener through Twisted endpoint strings (``ssl:PORT:privateKey=...``).

The certificate is self-signed and made here; each protocol is spoken over
it by a real client: ssl-wrapped sockets for MQKS, PHPMQ and eMQP's ZMTP
(pyzmq has no TLS transport, so the ZMTP greeting and frames are written by
hand, as a TLS-terminating proxy in front of a stock worker would), and
HTTPS for the HTTP API.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mqserver.protocols.phpmq import codec as phpmq
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.decoder import MessageDecoder

TOKEN = "tls-token"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a certificate for 127.0.0.1 (as an IP SAN), valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mqserver test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


class TLSSocket:
    """A verified TLS connection to 127.0.0.1 that reads until a condition holds."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_until(self, done, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not done(self.buffer):
            if time.monotonic() > deadline:
                raise TimeoutError(f"have {self.buffer!r}")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed; have {self.buffer!r}")
            self.buffer += chunk
        return self.buffer

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def tls_server(start_server, tmp_path):
    key, cert = self_signed(tmp_path)
    tls = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    server = start_server(
        "--storage=memory", f"--http-token={TOKEN}",
        f"--protocol=mqks:{tls}", f"--protocol=phpmq:{tls}", f"--protocol=emqp:{tls}",
        f"--emqp-backend={tls}", f"--emqp-admin={tls}", f"--http={tls}",
    )
    deadline = time.monotonic() + 10
    while not {"emqp-backend", "emqp-admin"} <= set(server.ports):
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.05)
    context = ssl.create_default_context(cafile=str(cert))
    sockets: list[TLSSocket] = []

    def connect(label: str) -> TLSSocket:
        sockets.append(TLSSocket(server.ports[label], context))
        return sockets[-1]

    yield server, connect, context
    for s in sockets:
        s.close()


def test_every_listener_logs_its_tls_address(tls_server):
    server, _, _ = tls_server
    assert set(server.ports) >= {"mqks", "phpmq", "emqp", "emqp-backend", "emqp-admin", "http"}
    assert all(port > 0 for port in server.ports.values())


def test_mqks_and_phpmq_over_tls(tls_server):
    _, connect, _ = tls_server
    mqks = connect("mqks")
    mqks.send(b"c consume --confirm q e\nm1 publish --confirm e over tls\n")
    lines = mqks.read_until(lambda b: b.count(b"\n") >= 3).split(b"\n")[:3]
    assert lines[0] == b"c ok "
    assert sorted(lines[1:]) == [b"c ok m1 event=e over tls", b"m1 ok "]
    php = connect("phpmq")
    php.send(phpmq.consume(b"jobs", 1) + phpmq.publish(b"jobs", b"framed over tls"))
    data = php.read_until(lambda b: b"framed over tls" in b)
    decoder = phpmq.FrameDecoder()
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame.type == phpmq.DISPATCH and frame.packages[phpmq.CONTENT] == b"framed over tls"


def _zmtp_messages(data: bytes) -> list[list[bytes]]:
    decoded = MessageDecoder(2**20, 64).feed(data[zmtp.GREETING_SIZE:])
    return [item for item in decoded if isinstance(item, list)]


def test_emqp_zmtp_over_tls_a_worker_informs_and_gets_a_request(tls_server):
    _, connect, _ = tls_server
    worker = connect("emqp-backend")
    worker.send(zmtp.greeting(1) + zmtp.ready_command(b"DEALER", b"w1"))
    worker.send(zmtp.encode_message(
        [b"", b"eMQP/1.0", b"INFORM", b"inf", b'[[10, "jobs"]]', b"worker"]))
    worker.read_until(lambda b: any(m[2:3] == [b"ACK"] for m in _zmtp_messages(b)))
    worker.send(zmtp.encode_message([b"", b"eMQP/1.0", b"READY", b"r1"]))
    client = connect("emqp")
    client.send(zmtp.greeting(1) + zmtp.ready_command(b"DEALER", b"c1"))
    client.send(zmtp.encode_message(
        [b"", b"eMQP/1.0", b"REQUEST", b"req-1", b"jobs", b"", b"payload over tls"]))
    data = worker.read_until(lambda b: b"payload over tls" in b)
    [request] = [m for m in _zmtp_messages(data) if m[2] == b"REQUEST"]
    assert request[3] == b"req-1" and request[-1] == b"payload over tls"


def test_https_api_with_the_token(tls_server):
    server, _, context = tls_server
    base = f"https://127.0.0.1:{server.ports['http']}"
    with urllib.request.urlopen(f"{base}/health", context=context, timeout=10) as answer:
        assert answer.status == 200
    request = urllib.request.Request(
        f"{base}/api/events/e", method="POST", data=json.dumps({"body": "x"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        assert answer.status == 201 and json.loads(answer.read())["event"] == "e"
    plain = ssl.create_default_context()  # the system CAs do not know our certificate
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/health", context=plain, timeout=10)
