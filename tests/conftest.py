"""Shared fixtures: a broker on a fake clock for unit tests, PostgreSQL servers,
headless Chromium."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import settings
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.pgtesting import PostgresCluster, find_bindir
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink

# The property tests draw the same examples on every run, so a commit's
# verdict does not depend on which examples a run happened to draw (a CI run
# once failed on an example no earlier run had drawn); HYPOTHESIS_PROFILE=explore
# draws fresh ones each run (docs/operations.md, "Property tests").  No
# deadline: an example's time is not what a property test checks (an HTTP
# codec property failed once on a 2-core build machine and passed when rerun
# unchanged; hypothesis's default 200 ms deadline is its one timing check).
settings.register_profile("repeatable", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker(clock: Clock) -> Broker:
    return Broker(MemoryStore(), clock)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of the test module's own (``mqserver.pgtesting``)."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, postgres): install Debian's "
                    "postgresql package (`make postgres-setup`; .ci/run does) or set "
                    "MQSERVER_PG_BINDIR")
    cluster = PostgresCluster.create(bindir)
    yield cluster
    cluster.destroy()


@pytest.fixture
def postgres_dsn(postgres_cluster: PostgresCluster) -> str:
    """A new, empty database on the module's cluster: its DSN."""
    return postgres_cluster.create_database(f"test_{next(_databases)}")


_databases = itertools.count(1)


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,900")


@pytest.fixture
def browser() -> Iterator:
    """Debian's headless Chromium driven by selenium, with a profile of its own;
    skips when selenium, chromium or chromedriver is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extras")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed "
                    "(apt-get install -y chromium chromium-driver; .ci/run does this)")
    profile = tempfile.mkdtemp(prefix="mqserver-chromium-")
    options = Options()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
