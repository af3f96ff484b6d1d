"""The bench's PHPMQ client reads and writes exactly what the server's codec does.

Its parser takes a shortcut for the 003s of the queue it consumes (they share
their first bytes); any chunking of any mix of 003s must still come out as
the codec decodes them, and its 004s must be the codec's.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.clients.phpmq import acks, dispatch_head, dispatches, package
from mqserver.protocols.phpmq import codec

_ids = st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=40))
_dispatches = st.builds(
    codec.dispatch,
    st.sampled_from([b"q", b"q.sync", b"other"]),
    st.binary(max_size=200),
    _ids,
    st.one_of(st.none(), st.integers(1, 10**6)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_dispatches, max_size=12), st.data())
def test_any_chunking_reads_as_the_codec_decodes(frames, data):
    wire = b"".join(frames)
    expected = [(f.packages[codec.CONTENT], f.packages[codec.MESSAGE_ID])
                for f in codec.decode(wire)]
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=10)))
    found: list[tuple[bytes, bytes]] = []
    pending = b""
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got, pending = dispatches(pending + wire[a:b], dispatch_head(b"q"))
        found.extend(got)
    assert found == expected
    assert pending == b""


@given(st.lists(_ids, max_size=5))
def test_acks_are_the_codecs(ids):
    assert acks(package(1, b"q"), ids) == b"".join(codec.ack(b"q", i) for i in ids)
