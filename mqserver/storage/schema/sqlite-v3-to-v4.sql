-- Upgrade step v3 -> v4.
-- messages_expiring: the messages with a TTL, by queue and seq.  A replay
-- reads a big backlog's rows when they are needed, not at the open, but the
-- broker needs every expiry time at once: this tells it, without a scan of
-- the table, which of a queue's runs hold one (none, usually: the index is
-- then empty, and a message without a TTL never touches it).
CREATE INDEX messages_expiring ON messages (queue, seq) WHERE expires_at IS NOT NULL;

UPDATE schema_version SET version = 4;
