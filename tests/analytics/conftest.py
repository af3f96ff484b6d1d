"""One SparkSession for every analytics test, and a generated journal.

Spark needs Java and the ``analytics`` extra; without them these tests skip
and say which is missing.  The session uses the fast local settings of
``mqserver.analytics.session`` (about 5 s to start, once).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the analytics extra (pyspark) is not installed")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark needs a JRE (openjdk-17-jre-headless)")
    from mqserver.analytics.session import build_session

    session, created = build_session("local[2]", progress=False)
    yield session
    if created:
        session.stop()
