"""SegmentCache: LRU under a byte budget, counters, thread safety."""

from __future__ import annotations

import threading
from array import array

from gateway.render.cache import ItemEntry, RenderedItem, SegmentCache


def _item(n: int) -> ItemEntry:
    return ItemEntry(RenderedItem("x" * n, (("content", 0, n),), n))


def test_lru_order_and_budget():
    c = SegmentCache(budget_bytes=2500)
    c.put_tokens([(("t", i), array("I", range(100))) for i in range(5)])  # ~584 bytes each
    assert c.bytes <= 2500
    assert c.get_tokens([("t", 0)]) == [None]  # oldest went first
    got = c.get_tokens([("t", 4), ("t", 3)])
    assert all(g is not None for g in got)
    c.get_tokens([("t", 2)])  # touch 2: now most recent
    c.put_tokens([(("t", 9), array("I", range(100)))])
    assert c.get_tokens([("t", 2)])[0] is not None
    s = c.stats()
    assert s.evictions >= 2 and s.token_hits >= 3 and s.token_misses >= 1
    assert s.bytes == c.bytes <= s.budget_bytes


def test_ids_still_in_use_are_found_after_their_entry_is_evicted():
    c = SegmentCache(budget_bytes=2500)
    held = array("I", range(100))  # a conversation's last render still holds these
    c.put_tokens([(("t", "held"), held), (("t", "dropped"), array("I", range(100)))])
    c.put_tokens([(("t", i), array("I", range(100))) for i in range(5)])  # both entries evicted
    assert c.get_tokens([("t", "held"), ("t", "dropped")]) == [held, None]


def test_oversized_value_is_not_cached():
    c = SegmentCache(budget_bytes=100)
    c.put_tokens([("big", array("I", range(1000)))])
    assert len(c) == 0 and c.bytes == 0


def test_items_grow_when_tokens_attach():
    c = SegmentCache(budget_bytes=10_000)
    e = _item(100)
    c.put_items([("k", e)])
    before = c.bytes
    c.attach_tokens([("k", e, array("I", range(50)))])
    assert c.bytes == before + 4 * 50 + 64
    assert c.get_items(["k"])[0] is e and e.ids is not None
    assert c.stats().render_hits == 1
    c.clear()
    assert c.bytes == 0 and c.get_items(["k"]) == [None]


def test_threads():
    c = SegmentCache(budget_bytes=50_000)

    def work(base: int) -> None:
        for i in range(300):
            k = (base, i % 40)
            if c.get_tokens([k])[0] is None:
                c.put_tokens([(k, array("I", range(i % 50)))])

    ts = [threading.Thread(target=work, args=(b,)) for b in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s = c.stats()
    assert s.bytes <= 50_000 and s.bytes == sum(v[1] for v in c._data.values())


def test_segment_tokens_are_found_by_digest():
    """Drift comparison reads an earlier turn's segment ids by (tokenizer path, digest, length)."""
    from gateway.render import Renderer, RenderOptions
    from gateway.render.tokenizer import load_tokenizer

    cache = SegmentCache()
    r = Renderer(RenderOptions(), cache=cache)
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"},
                         {"role": "assistant", "content": "hi", "reasoning_content": "r"},
                         {"role": "user", "content": "again"}]}
    for _ in range(2):  # cold, then warm (segments reused from item entries)
        got = r.render(body)
        path = load_tokenizer().path
        for s in got.segments:
            assert list(cache.get_tokens([(path, s.digest, len(s.text))])[0]) == list(s.token_ids)
            assert list(r.tokens_of(s.digest, len(s.text))) == list(s.token_ids)
    g = r.render_generated(body, {"role": "assistant", "content": "done", "reasoning_content": "think"})
    assert list(r.tokens_of(g.digest, len(g.text))) == list(g.token_ids)
