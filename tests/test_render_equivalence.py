"""The per-item fast path equals the full template render (the engine's path) on random requests,
and segment-wise tokenization equals whole-prompt tokenization."""

from __future__ import annotations

import random

import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.tokenizer import load_tokenizer
from tests.support.random_requests import random_request

@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(RenderOptions(), cache=SegmentCache(8 * 1024 * 1024))


@pytest.mark.parametrize("seed", range(300))
def test_fast_path_equals_template(renderer: Renderer, seed: int) -> None:
    body, opts = random_request(random.Random(seed))
    full = renderer.render_template(body, opts)
    r = renderer.render(body, opts)
    assert r.prompt == full
    # Marked full render splits into the same segment texts (the gateway's marker never leaks).
    assert "\x00" not in full


@pytest.mark.parametrize("seed", range(0, 300, 5))
def test_segment_tokenization(renderer: Renderer, seed: int) -> None:
    body, opts = random_request(random.Random(seed))
    r = renderer.render(body, opts)
    assert r.token_ids == list(load_tokenizer().encode(r.prompt))


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_append_only_turns_reuse_segments(seed: int) -> None:
    """Rendering a prefix, then the full request, renders only what changed and stays exact."""
    body, opts = random_request(random.Random(seed))
    cache = SegmentCache()
    rr = Renderer(opts, cache=cache)
    n = len(body["messages"])
    for k in range(1, n + 1):
        sub = {**body, "messages": body["messages"][:k]}
        got = rr.render(sub, opts)
        assert got.prompt == rr.render_template(sub, opts)
    fresh = Renderer(opts, cache=SegmentCache()).render(body, opts)
    assert got.token_ids == fresh.token_ids


def test_concurrent_distinct_renders_on_one_cache():
    """Threads rendering different requests through one renderer and cache agree with serial renders."""
    import threading

    cases = [random_request(random.Random(s)) for s in range(40)]
    serial = [Renderer(RenderOptions(), cache=SegmentCache()).render(b, o).token_ids for b, o in cases]
    shared = Renderer(RenderOptions(), cache=SegmentCache(64 * 1024))  # small: evictions under contention
    errors: list = []

    def work(offset: int) -> None:
        try:
            for _rep in range(3):
                for j in range(len(cases)):
                    k = (j + offset) % len(cases)
                    b, o = cases[k]
                    assert shared.render(b, o).token_ids == serial[k]
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i * 7,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
