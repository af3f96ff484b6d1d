"""The dashboard in a real browser: Debian's headless Chromium driven by selenium.

A publisher thread feeds a queue over the HTTP API while the page is open
(the ``browser`` fixture of tests/conftest.py); the test waits for the
queue's row and for its depth to change, then saves
a screenshot to tests/artifacts/dashboard.png (kept out of git).  The operator test
drives the queue detail view (peek with the read token, a move that asks for
the token, publish, purge) and saves a screenshot of each step beside it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

LISTEN = "tcp:0:interface=127.0.0.1"
TOKEN = "dashboard-token"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


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


READ_TOKEN = "dashboard-read-token"


def dead_letter(base: str, queue: str, count: int) -> None:
    """``count`` messages rejected past their retries: in ``queue``'s dead-letter queue."""
    for i in range(count):
        call(base, "POST", f"/api/queues/{queue}/messages",
             {"id": f"order-{i}", "body": f'{{"order": {i}, "total": {10 + i}.50}}',
              "headers": {"x-max-retries": "0", "kind": "invoice"}})
    batch = call(base, "POST", f"/api/queues/{queue}/consume",
                 {"consumer": "buggy-worker", "max": count})
    call(base, "POST", f"/api/queues/{queue}/reject",
         {"consumer": "buggy-worker", "ids": [m["id"] for m in batch["messages"]]})


def test_an_operator_replays_dead_letters_publishes_and_purges_from_the_dashboard(
        start_server, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    token = tmp_path / "token"
    token.write_text(TOKEN)
    server = start_server(f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}",
                          f"--http-token-file={token}", f"--http-read-token={READ_TOKEN}",
                          f"--data-dir={tmp_path / 'data'}", "--storage=sqlite")
    base = f"http://127.0.0.1:{server.ports['http']}"
    call(base, "PUT", "/api/queues/orders.dead", {})
    call(base, "PUT", "/api/queues/orders", {"dead_letter": "orders.dead",
                                             "bindings": ["order.created", "order.paid"]})
    dead_letter(base, "orders", 5)
    # a consumer that holds nothing (window 0 between polls), to show in the detail view
    call(base, "POST", "/api/queues/orders/consume",
         {"consumer": "billing-worker", "timeout": 0, "lease": 600})
    ARTIFACTS.mkdir(exist_ok=True)
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    browser.set_window_size(1400, 1250)

    def text(selector: str) -> str | None:
        return browser.execute_script(
            "const e = document.querySelector(arguments[0]);"
            "return e ? e.textContent : null;", selector)

    def screenshot(name: str) -> None:
        browser.execute_script("window.scrollTo(0, 0)")
        assert browser.save_screenshot(str(ARTIFACTS / name))

    def visible(element_id: str) -> bool:
        return not browser.execute_script(
            "return document.getElementById(arguments[0]).hidden", element_id)

    def open_queue(name: str) -> None:
        # the table is rebuilt every second: find and click in one script
        wait.until(lambda _: browser.execute_script(
            "const b = document.querySelector(`button.open-queue[data-queue='${arguments[0]}']`);"
            "if (b) b.click(); return !!b;", name))
        wait.until(lambda _: text("#detail-name") == name)

    def use_token(value: str) -> None:
        wait.until(lambda _: visible("login"))
        field = browser.find_element(By.ID, "token-input")
        field.clear()
        field.send_keys(value)
        browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
        wait.until(lambda _: not visible("login"))

    def queue(name: str) -> dict:
        return call(base, "GET", f"/api/queues/{name}/messages?limit=100")

    browser.get(base + "/")
    open_queue("orders.dead")
    # no token yet: the statistics show, the bodies do not
    wait.until(lambda _: text("#peek-login") == "Enter the token to see messages")
    assert text("#detail-depth") == "5"
    screenshot("dashboard-locked.png")

    # the read token shows the messages...
    browser.find_element(By.ID, "peek-login").click()
    use_token(READ_TOKEN)
    wait.until(lambda _: text('#detail-messages tr[data-id="order-0"] td.body') is not None)
    assert "x-dead-letter-reason: retries" in text('#detail-messages tr[data-id="order-0"]')
    assert browser.execute_script("return sessionStorage.getItem('mqserver-token')") == READ_TOKEN
    # ...but a move needs the token: the page asks for it
    wait.until(lambda _: browser.execute_script(
        "return document.getElementById('move-to').value") == "orders")
    limit = browser.find_element(By.ID, "move-limit")
    limit.send_keys("3")
    browser.find_element(By.CSS_SELECTOR, "#move-form button[type=submit]").click()
    wait.until(lambda _: visible("login"))
    assert "needs the token" in text("#token-why")
    assert "bearer token" in text("#action-result")
    assert queue("orders.dead")["depth"] == 5
    use_token(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#move-form button[type=submit]").click()
    wait.until(lambda _: text("#action-result") == "moved 3 to orders, 2 left")
    wait.until(lambda _: text("#detail-depth") == "2")
    screenshot("dashboard-move.png")
    moved = queue("orders")["messages"]
    assert [m["id"] for m in moved] == ["order-0", "order-1", "order-2"]
    assert all(m["retry"] == 0 and m["headers"] == {"x-max-retries": "0", "kind": "invoice"}
               for m in moved)

    # the source queue: its bindings, its consumer, the replayed messages
    open_queue("orders")
    wait.until(lambda _: text('#detail-messages tr[data-id="order-2"]') is not None)
    assert text("#detail-bindings") == "order.createdorder.paid"
    assert "billing-worker" in text("#detail-consumers tbody")
    body = browser.find_element(By.ID, "publish-body")
    body.clear()
    body.send_keys('{"order": 99, "note": "smoke test"}')
    browser.find_element(By.ID, "publish-headers").send_keys('{"kind": "test"}')
    browser.find_element(By.CSS_SELECTOR, "#publish-form button[type=submit]").click()
    wait.until(lambda _: (text("#action-result") or "").startswith("published "))
    wait.until(lambda _: text("#detail-depth") == "4")
    last = queue("orders")["messages"][-1]
    assert (last["body"], last["headers"]) == ('{"order": 99, "note": "smoke test"}',
                                               {"kind": "test"})
    screenshot("dashboard-publish.png")

    browser.find_element(By.ID, "purge").click()
    wait.until(lambda _: visible("purge-confirm"))
    assert text("#purge-yes") == "Yes, purge 4 ready messages"
    screenshot("dashboard-purge-confirm.png")
    browser.find_element(By.ID, "purge-yes").click()
    wait.until(lambda _: text("#action-result") == "purged 4 messages from orders")
    wait.until(lambda _: text("#detail-messages tbody") == "no ready messages")
    assert queue("orders")["depth"] == 0
    screenshot("dashboard-purged.png")

    # the token stays in this tab across a reload, and never in the address
    browser.refresh()
    wait.until(lambda _: text("#token-button") == "token ✓")
    assert TOKEN not in browser.current_url and READ_TOKEN not in browser.current_url
    assert "Traceback" not in server.text()
