"""The log index keeps a queue's oldest entries as runs, and answers as a dict."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.model import ENQUEUE, REQUEUE
from mqserver.storage import log_index
from mqserver.storage.log_index import LogIndex, loc
from mqserver.testing import message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "put", "put", "remove", "head", "move"]),
                          st.integers(0, 40)), max_size=200), st.integers(2, 6))
def test_an_archived_index_answers_as_a_plain_dict_would(ops, archive_at):
    """Puts of new seqs (ascending), removes (any, or the oldest: FIFO acks),
    and moves of a live seq (requeue in place, compaction), against a dict."""
    original = log_index.ARCHIVE_AT
    log_index.ARCHIVE_AT = archive_at
    try:
        index, model = LogIndex(), {}
        seq = offset = 0
        for op, n in ops:
            offset += 10
            if op == "put":
                seq += 1 + n % 3
                index.put_message(b"q", seq, loc(1, offset, 10 + n))
                model[seq] = loc(1, offset, 10 + n)
            elif model and op in ("remove", "head"):
                victim = min(model) if op == "head" else sorted(model)[n % len(model)]
                assert index.remove_message(b"q", victim)
                del model[victim]
            elif model:
                moved = sorted(model)[n % len(model)]
                index.put_message(b"q", moved, loc(2, offset, 11))
                model[moved] = loc(2, offset, 11)
            assert not index.remove_message(b"q", seq + 1)
            by_seq = index.messages[b"q"] if index.messages else None
            got = [] if by_seq is None else list(by_seq.everything())
            assert got == sorted(model.items())
            for key, location in model.items():
                assert index.message_location(b"q", key) == location
            assert index.live_total == sum(location & 0xFFFFFFFF for location in model.values())
    finally:
        log_index.ARCHIVE_AT = original



def test_ttl_seq_is_the_newest_seq_written_with_a_ttl():
    """``ttl_seq`` bounds the seqs whose flags a checkpoint's restart reads
    (``log_chunks.expiring_seqs``): raised by a message with a TTL, enqueued
    or requeued, never lowered (an older seq written again, one without)."""
    index = LogIndex()
    index.apply_op((ENQUEUE, message(3, expires_at=9e9)), loc(1, 16, 16))
    index.apply_op((ENQUEUE, message(5)), loc(1, 32, 16))
    assert index.ttl_seq == 3
    index.apply_op((REQUEUE, message(8, expires_at=9e9), 3), loc(1, 48, 16))
    index.apply_op((ENQUEUE, message(2, expires_at=9e9)), loc(1, 64, 16))
    assert index.ttl_seq == 8
