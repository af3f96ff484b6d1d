-- Upgrade step v3 -> v4.
-- meta 'expiring': 1 while a message row may have an expiry (expires_at),
-- 0 once none has.  A batch that writes such a row sets it in its own
-- transaction; an open that replays and finds none clears it.  The replay
-- reads a big backlog's rows when they are needed, not at the open, but the
-- broker needs every expiry time at once: with 0 it knows there is none
-- without a scan of the table.  (Why a version: a release before it would
-- write expiries without setting the mark; it refuses a file at version 4.)
INSERT OR REPLACE INTO meta (key, value)
    SELECT 'expiring', EXISTS (SELECT 1 FROM messages WHERE expires_at IS NOT NULL);

UPDATE schema_version SET version = 4;
