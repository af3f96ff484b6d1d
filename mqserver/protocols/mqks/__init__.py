"""MQKS: ``{request_id} {action} {data}`` text lines (see docs/protocols/mqks.md)."""
