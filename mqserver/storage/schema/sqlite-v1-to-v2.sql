-- Upgrade step v1 -> v2.
-- meta: remembers the next free seq.  Without it a store whose messages
-- were all acked restarts handing out seqs from 1 again, and anything
-- downstream that orders by seq (journal, analytics) sees time run backwards.
-- records: durable state that is not a message (PUT/DELETE ops: eMQP
-- schedules and the like), namespace -> key -> value, all bytes.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO meta (key, value) SELECT 'next_seq', COALESCE(MAX(seq), 0) + 1 FROM messages;

CREATE TABLE records (
    namespace BLOB NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (namespace, key)
);

UPDATE schema_version SET version = 2;
