-- mqserver PostgreSQL schema, version 1: the broker's durable state.
-- Names, ids, events and bodies are bytea (bytes everywhere in the broker);
-- headers are a JSON object, kept as written (json, not jsonb: the server
-- never queries them, and json stores them without re-encoding);
-- seq (a broker-wide counter) keys a message copy.
CREATE TABLE schema_version (
    version integer NOT NULL
);
INSERT INTO schema_version (version) VALUES (1);

CREATE TABLE queues (
    name bytea PRIMARY KEY,
    delete_when_unused double precision,
    delete_when_unused_bare boolean NOT NULL DEFAULT false,
    dead_letter bytea,
    max_length bigint,
    default_ttl double precision,
    overflow text
);

CREATE TABLE bindings (
    queue bytea NOT NULL,
    event bytea NOT NULL,
    PRIMARY KEY (queue, event)
);

CREATE TABLE messages (
    seq bigint PRIMARY KEY,
    queue bytea NOT NULL,
    id bytea NOT NULL,
    body bytea NOT NULL,
    event bytea,
    headers json,
    created_at double precision NOT NULL,
    expires_at double precision,
    retry integer NOT NULL DEFAULT 0,
    source text
);
-- delete_queue drops a queue's messages by queue
CREATE INDEX messages_by_queue ON messages (queue);

-- durable state that is not a message (PUT/DELETE ops: eMQP schedules and
-- the like), namespace -> key -> value, all bytes
CREATE TABLE records (
    namespace bytea NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- the next free seq: without it a store whose messages were all acked
-- restarts handing out seqs from 1 again
CREATE TABLE meta (
    key text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO meta (key, value) VALUES ('next_seq', 1);
