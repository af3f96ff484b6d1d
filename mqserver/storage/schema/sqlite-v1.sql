-- mqserver SQLite schema, version 1: the broker's durable state.
-- Names, ids, events and bodies are BLOBs (bytes everywhere in the broker);
-- headers are a JSON object; seq (a broker-wide counter) keys a message copy.
CREATE TABLE schema_version (
    version INTEGER NOT NULL
);
INSERT INTO schema_version (version) VALUES (1);

CREATE TABLE queues (
    name BLOB PRIMARY KEY,
    delete_when_unused REAL,
    delete_when_unused_bare INTEGER NOT NULL DEFAULT 0,
    dead_letter BLOB,
    max_length INTEGER,
    default_ttl REAL
);

CREATE TABLE bindings (
    queue BLOB NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (queue, event)
);

CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    queue BLOB NOT NULL,
    id BLOB NOT NULL,
    body BLOB NOT NULL,
    event BLOB,
    headers TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    retry INTEGER NOT NULL DEFAULT 0,
    source TEXT
);
-- recovery reads each queue in seq order; delete_queue drops by queue
CREATE INDEX messages_by_queue ON messages (queue, seq);
