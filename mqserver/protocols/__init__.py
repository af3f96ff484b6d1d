"""Wire protocols: each parses bytes and calls the broker, nothing more."""
