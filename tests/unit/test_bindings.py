"""The binding index against a brute-force regex model."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.broker.bindings import BindingIndex, mask_regex


def test_exact_and_mask_routes():
    index = BindingIndex()
    index.bind(b"q1", b"user.created")
    index.bind(b"q2", b"user.*")
    index.bind(b"q3", b"*.created")
    index.bind(b"q4", b"us*r.cre*")
    assert index.route(b"user.created") == (b"q1", b"q2", b"q3", b"q4")
    assert index.route(b"user.deleted") == (b"q2",)
    assert index.route(b"user") == ()


def test_unbind_prunes_and_invalidates_cache():
    index = BindingIndex()
    index.bind(b"q", b"a.*.c")
    assert index.route(b"a.b.c") == (b"q",)
    assert index.unbind(b"q", b"a.*.c")
    assert not index.unbind(b"q", b"a.*.c")
    assert index.route(b"a.b.c") == ()
    assert index.by_queue == {}


def test_mask_regex_matches_star_as_non_dot_run():
    regex = mask_regex([b"e5.*.a1"])
    assert regex.match(b"e5.id1.a1")
    assert regex.match(b"e5..a1")
    assert not regex.match(b"e5.x.y.a1")
    assert not regex.match(b"e5.id1.a10")


segment = st.sampled_from([b"a", b"b", b"ab", b"*", b"a*", b"*b", b""])
pattern = st.lists(segment, min_size=1, max_size=4).map(b".".join)
event = st.lists(st.sampled_from([b"a", b"b", b"ab", b"aab", b""]), min_size=1, max_size=4).map(
    b".".join
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"q1", b"q2", b"q3"]), pattern), max_size=12),
       st.lists(st.tuples(st.sampled_from([b"q1", b"q2", b"q3"]), pattern), max_size=6),
       st.lists(event, min_size=1, max_size=8))
def test_route_agrees_with_brute_force(binds, unbinds, events):
    index = BindingIndex()
    model: set[tuple[bytes, bytes]] = set()
    for queue, pat in binds:
        index.bind(queue, pat)
        model.add((queue, pat))
    for queue, pat in unbinds:
        index.unbind(queue, pat)
        model.discard((queue, pat))
    for ev in events:
        expected = set()
        for queue, pat in model:
            if b"*" in pat:
                if mask_regex([pat]).match(ev):
                    expected.add(queue)
            elif pat == ev:
                expected.add(queue)
        assert set(index.route(ev)) == expected, (ev, model)
        assert set(index.route(ev)) == expected  # cached answer too
    assert {(q, e) for q, es in index.by_queue.items() for e in es} == model


def test_mask_regex_escapes_specials():
    assert mask_regex([b"a+b.*"]).match(b"a+b.x")
    assert not mask_regex([b"a+b.*"]).match(b"aab.x")
    assert re.escape(b"+") == rb"\+"
