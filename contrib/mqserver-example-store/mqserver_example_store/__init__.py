"""An example third-party mqserver storage backend; see ``store.JSONSnapshotStore``."""
