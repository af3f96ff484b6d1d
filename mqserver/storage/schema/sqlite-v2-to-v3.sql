-- Upgrade step v2 -> v3.
-- queues.overflow: what a full queue (max_length) does with a new publish,
-- 'drop-head' or 'reject-publish'; NULL follows the server's --overflow.
ALTER TABLE queues ADD COLUMN overflow TEXT;

UPDATE schema_version SET version = 3;
