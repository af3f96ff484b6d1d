"""Makes ``twistd mqserver --storage=jsonsnap`` find the example backend.

Only the descriptor lives here, and it imports the store lazily: every
``twistd`` run imports this module during the plugin scan.
"""

from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from mqserver.interfaces import IStoragePlugin


@implementer(IPlugin, IStoragePlugin)
class JSONSnapshotPlugin:
    name = "jsonsnap"
    description = "example third-party backend: the whole state as one JSON file"
    options = [
        ["jsonsnap-file", None, "jsonsnap.json",
         "jsonsnap: snapshot file name, inside --data-dir."],
    ]

    def build_store(self, config: Any, reactor: Any) -> Any:
        import os

        from mqserver_example_store.store import JSONSnapshotStore

        path = os.path.join(config.get("data-dir", "data"), config.get("jsonsnap-file"))
        return JSONSnapshotStore(path, reactor)


jsonsnap = JSONSnapshotPlugin()
