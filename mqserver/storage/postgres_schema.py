# -*- test-case-name: tests.unit.test_storage_postgres_schema -*-
"""The PostgreSQL store's schema: version 1 from ``schema/postgres-v1.sql``,
then one ``schema/postgres-vN-to-vM.sql`` step per version, all in one
transaction, as for SQLite (``docs/storage.md``).

The tables live in the session's current schema (the first of its
``search_path``), so ``options=-csearch_path=NAME`` in the DSN gives one
mqserver a schema of its own in a shared database.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

import psycopg

from mqserver.storage.errors import StoreFormatError

SCHEMA_VERSION = 1
#: tables of ours: one of them without ``schema_version`` means the schema is not ours
TABLES = ("schema_version", "queues", "bindings", "messages", "records", "meta")


def schema_script(name: str) -> str:
    """The text of one schema file shipped as package data."""
    return resources.files("mqserver.storage").joinpath("schema", name).read_text("utf-8")


def upgrade_steps(version: int, latest: int = SCHEMA_VERSION) -> list[str]:
    """Script names that take a schema at ``version`` (0: empty) to ``latest``."""
    steps = ["postgres-v1.sql"] if version == 0 else []
    for start in range(max(version, 1), latest):
        steps.append(f"postgres-v{start}-to-v{start + 1}.sql")
    return steps


def current_version_thd(conn: psycopg.Connection[Any]) -> int:
    """The version of the schema in the session's current schema (0: none yet)."""
    if conn.execute("SELECT to_regclass('schema_version')").fetchone()[0]:  # type: ignore[index]
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None:
            raise StoreFormatError("the schema_version table is empty")
        return int(row[0])
    # none: a new schema, or someone else's (information_schema is slow, so
    # it is asked only here)
    found = {name for (name,) in conn.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_name = ANY(%s)", (list(TABLES),),
    )}
    if found:
        raise StoreFormatError(
            f"the schema has tables named {', '.join(sorted(found))} but no schema_version: "
            "not an mqserver database (choose another database or search_path)"
        )
    return 0


def upgrade_thd(conn: psycopg.Connection[Any], latest: int = SCHEMA_VERSION,
                script: Callable[[str], str] = schema_script) -> str | None:
    """Bring the schema to ``latest`` in one transaction; what it did, for the log.

    ``conn`` is in autocommit mode and holds the store's lock, so no other
    mqserver upgrades at the same time.  A failing step rolls the whole
    upgrade back: the schema stays at the version it had.
    """
    with conn.transaction():
        version = current_version_thd(conn)
        if version > latest:
            raise StoreFormatError(
                f"the database has schema version {version}; this mqserver knows up to "
                f"{latest} (was it written by a newer release?)"
            )
        steps = upgrade_steps(version, latest)
        for name in steps:
            conn.execute(script(name).encode("utf-8"))
    if not steps:
        return None
    if version == 0:
        return f"PostgreSQL schema created at version {latest}"
    return f"PostgreSQL schema upgraded from version {version} to {latest} ({', '.join(steps)})"
