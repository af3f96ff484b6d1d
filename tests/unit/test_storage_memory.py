"""The memory backend passes the storage contract."""

from pathlib import Path

from mqserver.storage.memory import MemoryStore
from mqserver.testing import StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self, path: Path) -> MemoryStore:
        return MemoryStore()

    def reopen(self, store, path):
        # A memory store keeps its state in the object: "restart" is close + open.
        store.close()
        return store

    def test_not_durable(self) -> None:
        assert MemoryStore().durable is False
