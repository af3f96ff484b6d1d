"""The dashboard in a real browser: Debian's headless Chromium driven by selenium.

A publisher thread feeds a queue over the HTTP API while the page is open;
the test waits for the queue's row and for its depth to change, then saves
a screenshot to tests/artifacts/dashboard.png (kept out of git).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

LISTEN = "tcp:0:interface=127.0.0.1"
TOKEN = "dashboard-token"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,900")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extras")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed "
           "(apt-get install -y chromium chromium-driver; .ci/run does this)",
)


def call(base: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        base + path, method=method, data=json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


class Publisher(threading.Thread):
    """Publishes to ``queue`` every 50 ms, for at most ``limit`` seconds."""

    def __init__(self, base: str, queue: str, limit: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.base, self.queue, self.limit = base, queue, limit
        self.stopped = threading.Event()
        self.sent = 0

    def run(self) -> None:
        deadline = time.monotonic() + self.limit
        while not self.stopped.is_set() and time.monotonic() < deadline:
            call(self.base, "POST", f"/api/queues/{self.queue}/messages", {"body": "tick"})
            self.sent += 1
            self.stopped.wait(0.05)


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mqserver-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_dashboard_shows_the_queue_and_its_changing_depth(start_server, tmp_path, browser,
                                                          line_client):
    from selenium.webdriver.support.ui import WebDriverWait

    token = tmp_path / "token"
    token.write_text(TOKEN)
    server = start_server(f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}",
                          f"--http-token-file={token}", "--storage=memory")
    base = f"http://127.0.0.1:{server.ports['http']}"
    consumer = line_client(server.ports["mqks"])  # one MQKS connection to show
    consumer.send("p ping x")
    assert consumer.read(1) == [b"p ok x"]
    call(base, "PUT", "/api/queues/demo-orders", {"bindings": ["order.*"]})
    publisher = Publisher(base, "demo-orders")
    publisher.start()
    try:
        browser.get(base + "/")
        row = '#queues tr[data-queue="demo-orders"]'
        wait = WebDriverWait(browser, 20, poll_frequency=0.2)

        def text(selector: str) -> str | None:
            # read in one script: the page rebuilds its rows every second, so an
            # element found by one call may be gone by the next
            return browser.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "return e ? e.textContent : null;", selector)

        seen = int(wait.until(lambda _: text(row + " td.depth")))
        changed = wait.until(lambda _: int(text(row + " td.depth")) != seen
                             and int(text(row + " td.depth")))
        assert changed > seen
        assert text("#status") == "live"
        assert text("#storage-state") == "ok"
        assert text('#protocols tr[data-protocol="mqks"] td.num') == "1"
        # a few more polls so the sparklines have something to draw
        wait.until(lambda _: float(text(row + " td.publish")) > 0)
        wait.until(lambda _: len(browser.execute_script(
            "return document.querySelector(arguments[0]).getAttribute('points')",
            row + " td:nth-child(3) polyline").split()) >= 6)
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        publisher.stopped.set()
        publisher.join(10)
    assert publisher.sent > 0
