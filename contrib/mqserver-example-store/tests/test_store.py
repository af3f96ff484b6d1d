"""The example backend passes mqserver's storage contract, like every backend must."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
from mqserver_example_store.store import JSONSnapshotStore
from twisted.plugin import getPlugins

from mqserver.interfaces import IStoragePlugin
from mqserver.model import DECLARE, ENQUEUE, QueueOptions
from mqserver.testing import StoreContract, message


class TestJSONSnapshotStore(StoreContract):
    def make_store(self, path: Path) -> JSONSnapshotStore:
        return JSONSnapshotStore(path / "state.json")


def test_the_plugin_is_found_by_name():
    plugins = {plugin.name: plugin for plugin in getPlugins(IStoragePlugin)}
    assert "jsonsnap" in plugins
    store = plugins["jsonsnap"].build_store({"data-dir": "somewhere",
                                             "jsonsnap-file": "x.json"}, None)
    assert isinstance(store, JSONSnapshotStore)
    assert store.path == Path("somewhere") / "x.json"


@pytest_twisted.inlineCallbacks
def test_one_snapshot_per_batch_and_no_temporary_left(tmp_path: Path) -> Any:
    store = JSONSnapshotStore(tmp_path / "state.json")
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions())] + [(ENQUEUE, message(n)) for n in (1, 2)])
    yield store.apply([(ENQUEUE, message(3))])
    yield store.close()
    assert store.snapshots == 2
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert json.loads((tmp_path / "state.json").read_text())["next_seq"] == 4
