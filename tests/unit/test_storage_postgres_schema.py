"""The PostgreSQL schema: created by the same steps that upgrade it, never guessed at."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import pytest_twisted

from mqserver.storage.errors import StoreFormatError
from mqserver.storage.postgres import PostgresStore
from mqserver.storage.postgres_schema import (
    SCHEMA_VERSION,
    current_version_thd,
    schema_script,
    upgrade_steps,
    upgrade_thd,
)

# a made-up next version, to walk the upgrade path before a real one exists
V1_TO_V2 = """
ALTER TABLE queues ADD COLUMN note text NOT NULL DEFAULT 'upgraded';
UPDATE schema_version SET version = 2;
"""


def scripts(**extra: str) -> Any:
    return lambda name: extra.get(name) or schema_script(name)


def test_upgrade_steps_cover_every_version() -> None:
    assert upgrade_steps(0) == ["postgres-v1.sql"]
    assert upgrade_steps(0, latest=3) == [
        "postgres-v1.sql", "postgres-v1-to-v2.sql", "postgres-v2-to-v3.sql",
    ]
    assert upgrade_steps(2, latest=3) == ["postgres-v2-to-v3.sql"]
    assert upgrade_steps(SCHEMA_VERSION) == []
    for name in upgrade_steps(0):
        assert schema_script(name)  # every step ships as package data


def columns(conn: psycopg.Connection[Any]) -> list[tuple[str, ...]]:
    return conn.execute(
        "SELECT table_name::text, column_name::text, data_type::text FROM "
        "information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2"
    ).fetchall()


def test_upgrade_keeps_the_data_in_one_transaction(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert upgrade_thd(conn) == "PostgreSQL schema created at version 1"
        conn.execute("INSERT INTO queues (name, max_length) VALUES ('\\x71', 5)")
        assert upgrade_thd(conn) is None  # up to date: nothing to do
        note = upgrade_thd(conn, latest=2, script=scripts(**{"postgres-v1-to-v2.sql": V1_TO_V2}))
        assert note == ("PostgreSQL schema upgraded from version 1 to 2 "
                        "(postgres-v1-to-v2.sql)")
        assert current_version_thd(conn) == 2
        assert conn.execute("SELECT name, max_length, note FROM queues").fetchall() == [
            (b"q", 5, "upgraded"),
        ]


def test_a_failing_step_leaves_the_old_version_whole(postgres_dsn: str) -> None:
    broken = V1_TO_V2 + "SELECT no_such_function();"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        upgrade_thd(conn)
        before = columns(conn)
        with pytest.raises(psycopg.errors.UndefinedFunction):
            upgrade_thd(conn, latest=2, script=scripts(**{"postgres-v1-to-v2.sql": broken}))
        assert current_version_thd(conn) == 1 and columns(conn) == before


def test_a_fresh_schema_equals_one_made_step_by_step(postgres_dsn: str) -> None:
    step_by_step = scripts(**{"postgres-v1-to-v2.sql": V1_TO_V2})
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA a; CREATE SCHEMA b")
        conn.execute("SET search_path = a")
        upgrade_thd(conn)
        upgrade_thd(conn, latest=2, script=step_by_step)
        upgraded = columns(conn)
        conn.execute("SET search_path = b")
        upgrade_thd(conn, latest=2, script=step_by_step)
        assert columns(conn) == upgraded and upgraded


@pytest_twisted.inlineCallbacks
def test_a_newer_schema_is_refused(postgres_dsn: str) -> Any:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        upgrade_thd(conn)
        conn.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    store = PostgresStore(postgres_dsn)
    with pytest.raises(StoreFormatError, match="newer release"):
        yield store.open()
    assert not store.is_open


@pytest_twisted.inlineCallbacks
def test_a_foreign_schema_is_refused(postgres_dsn: str) -> Any:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE messages (id serial PRIMARY KEY, text text)")
    store = PostgresStore(postgres_dsn)
    with pytest.raises(StoreFormatError, match="not an mqserver database"):
        yield store.open()
