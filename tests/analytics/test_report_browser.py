"""The HTML report of a real server's journal, in Debian's headless Chromium.

The real server (``journaled_server``) takes a mixed workload from blocking
raw-socket clients in threads, for ``MQSERVER_REPORT_SECONDS`` (default 6):

- an MQKS publisher whose rate swings (a sine between about 30 and 270
  messages a second) to ``orders`` and ``emails``, 3 to 1;
- two MQKS consumers on ``orders`` with manual acks: a fast one that rejects
  one message in 50 (redelivered), and a slow one (a few ms per message) that
  leaves and comes back every third of the run (its deliveries are requeued);
- an MQKS consumer on ``emails`` without manual ack;
- a PHPMQ client that publishes to ``pq`` with a 1 s TTL from the start but
  only consumes after a third of the run (the first ones expire), acks, and
  dead-letters one message in 20.

``mqserver-analytics --html`` then writes the report, and the browser checks
that it renders, that every chart has data points, and that no time axis
spans more than the journal does (from the SVG's ``data-x-min``/``data-x-max``
and where the points are drawn).  The page's screenshot goes to
tests/artifacts/analytics-report.png (kept out of git).  The report in
docs/analytics.md came from a 90 s run::

    MQSERVER_REPORT_SECONDS=90 .venv/bin/python -m pytest tests/analytics/test_report_browser.py
"""

from __future__ import annotations

import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mqserver.analytics import cli
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import MESSAGE_ID, FrameDecoder

DELIVERY = re.compile(r"^(\w+) ok (\S+) ")
MORE_THAN_3_DIGITS = r"(?<![\d.])(?:0\.0*[1-9]\d{3,}|[1-9]\d*\.\d{3,})"
"""Like 0.055356130738711505 or 12.345: a decimal with more than three significant digits."""
SECONDS = float(os.environ.get("MQSERVER_REPORT_SECONDS", "6"))
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FIGURES = ["throughput", "published-by-queue", "depth", "latency-publish_to_ack",
           "latency-publish_to_deliver", "consumer-acks", "consumer-deliveries"]




def connect(port: int) -> socket.socket:
    """Without Nagle's algorithm, as the server does: a small ack written after
    a small ack would otherwise wait for the server's delayed ACK (40 ms on
    Linux), and every latency in the report would show it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class MQKS:
    """Lines in and out over one socket."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.buffer = b""

    def send(self, *lines: str) -> None:
        self.sock.sendall("".join(line + "\n" for line in lines).encode())

    def lines(self, deadline: float) -> list[str]:
        """What arrived within 0.1 s (and before ``deadline``), as whole lines."""
        self.sock.settimeout(max(0.001, min(0.1, deadline - time.monotonic())))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return []
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line.decode() for line in lines]


def publisher(port: int, deadline: float, started: float) -> None:
    client = MQKS(port)
    n = 0
    while (now := time.monotonic()) < deadline:
        per_second = 150 + 120 * math.sin((now - started) / 40 * 2 * math.pi)
        batch = max(1, round(per_second / 20))
        client.send(*(f"p{n + i} publish {'ev.mail' if (n + i) % 4 == 0 else 'ev.order'} "
                      f"body {n + i}" for i in range(batch)))
        n += batch
        time.sleep(0.05)
    client.sock.close()


def consumer(port: int, deadline: float, name: str, queue: str, event: str, *,
             manual: bool = True, reject_every: int = 0, work_s: float = 0.0,
             leave_every: float = 0.0) -> None:
    """Consume until ``deadline``; ack (or reject) each delivery after ``work_s``."""
    rng = random.Random(name)
    while time.monotonic() < deadline:
        client = MQKS(port)
        client.send(f"{name} consume {queue} {event}{' --manual-ack' if manual else ''}")
        leave = time.monotonic() + leave_every if leave_every else deadline
        while (now := time.monotonic()) < min(leave, deadline):
            for line in client.lines(deadline):
                match = DELIVERY.match(line)
                if not (manual and match and match.group(1) == name):
                    continue
                time.sleep(work_s)
                verb = "reject" if reject_every and rng.randrange(reject_every) == 0 else "ack"
                client.send(f"x {verb} {name} {match.group(2)}")
        client.sock.close()
        if leave_every and now < deadline:
            time.sleep(0.5)


def php(port: int, deadline: float, started: float, seconds: float) -> None:
    client = connect(port)
    decoder = FrameDecoder()
    consuming = False
    n = received = 0
    publish_at = time.monotonic()
    while (now := time.monotonic()) < deadline:
        if now >= publish_at:  # 60 a second, whatever comes back
            client.sendall(b"".join(codec.publish(b"pq", b"php %d" % (n + i), ttl=1)
                                    for i in range(3)))
            n += 3
            publish_at += 0.05
        if not consuming and now - started > seconds / 3:
            client.sendall(codec.consume(b"pq", 20))
            consuming = True
        client.settimeout(max(0.001, publish_at - time.monotonic()))
        try:
            decoder.feed(client.recv(65536))
        except TimeoutError:
            continue
        while (frame := decoder.next_frame()) is not None:
            received += 1
            settle = codec.dead_letter if received % 20 == 0 else codec.ack
            client.sendall(settle(b"pq", frame.packages[MESSAGE_ID]))
    client.close()


def run(ports: dict[str, int], seconds: float) -> list[BaseException]:
    """The workload against a server listening on ``ports`` (``mqks``, ``phpmq``);
    returns what the clients raised."""
    started = time.monotonic()
    deadline = started + seconds
    jobs: list[tuple[Callable[..., None], tuple, dict]] = [
        (consumer, (ports["mqks"], deadline, "fast", "orders", "ev.order"), {"reject_every": 50}),
        (consumer, (ports["mqks"], deadline, "slow", "orders", "ev.order"),
         {"work_s": 0.004, "leave_every": seconds / 3}),
        (consumer, (ports["mqks"], deadline, "mail", "emails", "ev.mail"), {"manual": False}),
        (publisher, (ports["mqks"], deadline, started), {}),
        (php, (ports["phpmq"], deadline, started, seconds), {}),
    ]
    errors: list[BaseException] = []

    def guarded(job: Callable[..., None], *args: object, **kwargs: object) -> None:
        try:
            job(*args, **kwargs)
        except Exception as error:  # reported by the test, not lost in a thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(f, *a), kwargs=k, daemon=True)
               for f, a, k in jobs]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # consumers first, so the publisher's first messages are routed
    for thread in threads:
        thread.join(seconds + 30)
    return errors


CHECK = """
const main = document.querySelector('main');
const start = parseFloat(main.dataset.start), end = parseFloat(main.dataset.end);
return {start, end, text: document.body.innerText,
        figures: [...document.querySelectorAll('figure')].map(f => f.id),
        balanced: [...document.querySelectorAll('#balance ~ table tr td:last-child')]
                  .map(td => td.textContent),
        plots: [...document.querySelectorAll('svg.plot')].map(svg => {
  const frame = svg.querySelector('rect.frame').getBoundingClientRect();
  const points = [...svg.querySelectorAll('.pt')];
  const outside = points.filter(p => {
    const r = p.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
    return x < frame.left - 1 || x > frame.right + 1 || y < frame.top - 1 || y > frame.bottom + 1;
  }).length;
  return {id: svg.closest('figure').id, kind: svg.dataset.xKind,
          min: parseFloat(svg.dataset.xMin), max: parseFloat(svg.dataset.xMax),
          xs: points.map(p => parseFloat(p.dataset.x)), points: points.length, outside,
          width: svg.getBoundingClientRect().width};
})};
"""


def test_report_of_a_real_journal_renders_with_charts_inside_the_journal_span(
        spark, tmp_path, journaled_server, browser):
    journal = tmp_path / "journal"
    ports = journaled_server(journal, "mqks", "phpmq")
    try:
        errors = run(ports, SECONDS)
    finally:
        journaled_server.stop()
    assert not errors
    out = tmp_path / "out"
    assert cli.main(["--journal", str(journal), "--out", str(out), "--reports",
                     "balance,latency,redelivery,consumers", "--html"]) == 0

    browser.set_window_size(1000, 1000)
    browser.get((out / "report.html").as_uri())
    page = browser.execute_script(CHECK)
    assert page["figures"] == FIGURES
    span = page["end"] - page["start"]
    assert SECONDS - 1 < span < SECONDS + 30
    assert page["balanced"] == ["yes", "yes", "yes"]  # emails, orders, pq
    assert [plot["id"] for plot in page["plots"]] == FIGURES
    for plot in page["plots"]:
        assert plot["points"] > 0, plot["id"]
        assert plot["outside"] == 0, plot["id"]
        assert plot["width"] > 500, plot["id"]  # laid out, not collapsed
        assert all(plot["min"] <= x <= plot["max"] for x in plot["xs"]), plot["id"]
        if plot["kind"] == "time":
            assert page["start"] <= plot["min"] and plot["max"] <= page["end"], plot["id"]
            assert plot["max"] - plot["min"] <= span, plot["id"]
    for label in ("messages published", "throughput", "latency p50", "latency p99",
                  "redelivery rate", "dead letters", "expired", "balanced"):
        assert label in page["text"], label
    assert not re.search(MORE_THAN_3_DIGITS, page["text"])  # numbers rounded for people

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1000, height + 200)  # the window's frame is not page
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "analytics-report.png"))
