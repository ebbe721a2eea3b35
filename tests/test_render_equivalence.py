"""The per-item fast path equals the full template render (the engine's path) on random requests,
and segment-wise tokenization equals whole-prompt tokenization."""

from __future__ import annotations

import json
import random

import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.tokenizer import load_tokenizer

WORDS = ["alpha", "beta", "x = 1", "naïve café", "日本語", "<think>", "\n", "  ", "}{", "[]", "?\n\n", "end."]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))


def _content(rng: random.Random, allow_none: bool) -> object:
    x = rng.random()
    if allow_none and x < 0.1:
        return None
    if x < 0.7:
        return _text(rng)
    parts = []
    for _ in range(rng.randrange(0, 4)):
        if rng.random() < 0.7:
            parts.append({"type": "text", "text": _text(rng)})
        else:
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    return parts


def _args(rng: random.Random) -> object:
    d = {}
    for i in range(rng.randrange(0, 4)):
        d[f"k{i}"] = rng.choice(["str val", 3, 2.5, True, None, [1, "a"], {"n": {"m": "ü"}}, ""])
    return json.dumps(d, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.7 else d


TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}]


def random_request(rng: random.Random) -> tuple[dict, RenderOptions]:
    msgs: list[dict] = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": _content(rng, True)})
    call_ids: list[str] = []
    for _ in range(rng.randrange(1, 12)):
        r = rng.choice(["user", "user", "assistant", "assistant", "tool", "tool", "developer", "system"])
        if r == "user":
            msgs.append({"role": "user", "content": _content(rng, False)})
        elif r == "developer":
            msgs.append({"role": "developer", "content": "dev " + _text(rng)})
        elif r == "system":
            msgs.append({"role": "system", "content": _content(rng, True)})
        elif r == "tool":
            m = {"role": "tool", "content": _content(rng, False)}
            if call_ids and rng.random() < 0.8:
                m["tool_call_id"] = rng.choice(call_ids + ["unknown"])
            msgs.append(m)
        else:
            m = {"role": "assistant", "content": _content(rng, True)}
            if rng.random() < 0.6:
                m["reasoning_content"] = _text(rng)
            if rng.random() < 0.5:
                n = rng.randrange(1, 4)
                call_ids = [f"c{rng.randrange(100)}" for _ in range(n)]
                m["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": rng.choice("fg"), "arguments": _args(rng)}}
                    if rng.random() < 0.9 else {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    for cid in call_ids
                ]
            msgs.append(m)
    body: dict = {"messages": msgs}
    if rng.random() < 0.4:
        body["tools"] = rng.choice([TOOLS, TOOLS[:1], []])
    if rng.random() < 0.15:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    opts = RenderOptions(
        thinking=rng.random() < 0.6,
        reasoning_effort=rng.choice([None, "low", "high", "xhigh", "max", 1, 37, 100]),
        drop_thinking=rng.random() < 0.7,
    )
    return body, opts


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
