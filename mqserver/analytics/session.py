"""Building the SparkSession: fast settings for local runs, hands off a real cluster's.

The local settings are the ones measured in shared/notes/spark.md (start in
about 5 s instead of up to 17 s).  A master chosen explicitly, or by
spark-submit, keeps its own configuration: tuning a cluster's shuffle
partitions or driver memory from here would be wrong for it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.log.level": "ERROR",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}
"""Settings for a ``local[...]`` master (small journals, 2-core machines)."""

COMMON_CONF = {"spark.sql.session.timeZone": "UTC"}
"""Needed for correct results everywhere: journal timestamps are UTC."""


def is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def build_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    progress: bool | None = None,
    app_name: str = "mqserver-analytics",
) -> tuple[Any, bool]:
    """``(session, created)``; ``created`` is False when one was already running.

    Under spark-submit (``PYSPARK_GATEWAY_PORT`` set) or with an active
    session, the master is never set here.  Otherwise ``master`` defaults to
    ``local[*]``, and a local master gets ``LOCAL_CONF``.  Either way the
    session can read ``format("mqserver-journal")`` (``mqserver.analytics.stream``).
    """
    from pyspark.sql import SparkSession

    from mqserver.analytics.stream import register

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    builder = SparkSession.builder.appName(app_name)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        master = master or "local[*]"
        builder = builder.master(master)
        if is_local(master):
            # Python workers must be this interpreter: PATH's python3 has
            # neither pyarrow nor mqserver
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            for key, value in LOCAL_CONF.items():
                builder = builder.config(key, value)
        else:
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if progress is None:
        progress = sys.stderr.isatty()
    builder = builder.config("spark.ui.showConsoleProgress", str(progress).lower())
    for key, value in {**COMMON_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session, True
