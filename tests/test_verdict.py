"""The turn's cache verdict as the state, records and the admin API carry it (core/verdict.py)."""

from __future__ import annotations

import orjson

from gateway.conversations.state import ConversationState
from gateway.core.verdict import CacheVerdict, KvNote


def test_json_has_the_fixed_keys_and_only_the_optional_ones_set() -> None:
    v = CacheVerdict("drift", 900, 300, cause="tools_reordered", divergence_message_index=0, tokens_lost=600,
                     seconds_lost=0.15, rendered_prompt_tokens=1000, render="exact", render_check="count",
                     render_matches_engine=True)
    out = v.to_json()
    assert list(out)[:12] == ["predicted_cached_tokens", "reported_cached_tokens", "verdict", "cause",
                              "divergence_message_index", "divergence_field", "lcp_tokens", "tokens_lost",
                              "seconds_lost", "rendered_prompt_tokens", "render", "repinned"]
    assert out["render_check"] == "count" and out["render_matches_engine"] is True
    assert "render_check_why" not in out and "kv" not in out and "note" not in out
    assert CacheVerdict.from_json(orjson.loads(orjson.dumps(out))) == v


def test_the_kv_note_reads_as_one_object_with_the_index_explanation_inline() -> None:
    v = CacheVerdict("eviction", 64, 32, tokens_lost=32)
    v.kv = KvNote("http://127.0.0.1:1", "live", evidence={"cause": "displaced", "held_tokens": 32, "note": ""},
                  pressure={"pool_tokens": 4096})
    kv = v.to_json()["kv"]
    assert kv == {"replica": "http://127.0.0.1:1", "stream": "live", "cause": "displaced", "held_tokens": 32,
                  "note": "", "pressure": {"pool_tokens": 4096}}
    assert CacheVerdict.from_json(v.to_json()).kv == KvNote("http://127.0.0.1:1", "live",
                                                            evidence={"cause": "displaced", "held_tokens": 32,
                                                                      "note": ""},
                                                            pressure={"pool_tokens": 4096})


def test_a_state_written_before_reads_its_verdict_and_ignores_keys_it_does_not_know() -> None:
    written = orjson.dumps({"id": "c1", "src": "header", "c": 1.0, "u": 2.0, "t": 3, "last": None,
                            "lc": {"verdict": "hit", "predicted_cached_tokens": 512, "tokens_lost": None,
                                   "a_key_from_another_version": 1}})
    state = ConversationState.from_bytes(written)
    assert state.last_cache == CacheVerdict("hit", 512)
    again = ConversationState.from_bytes(state.to_bytes())
    assert again.last_cache == state.last_cache


def test_unknown_says_why() -> None:
    out = CacheVerdict.unknown("analysis failed").to_json()
    assert (out["verdict"], out["note"], out["predicted_cached_tokens"], out["tokens_lost"]) == \
        ("unknown", "analysis failed", None, 0)


def test_a_new_verdict_replaces_the_states_last_without_touching_the_rest() -> None:
    state = ConversationState("c1", "header", lane="a", turn=2)
    state.last_cache = CacheVerdict("cold", 0, 0, render="exact", note='a "lc": look-alike, {"lc": 1}')
    data = state.to_bytes()
    hit = CacheVerdict("hit", 4096, 4096, cause="shared_prefix", shared_prefix_tokens=4096)
    patched = ConversationState.with_last_cache(data, hit)
    state.last_cache = hit
    assert patched == state.to_bytes()
    assert ConversationState.from_bytes(patched).last_cache == hit
    none = ConversationState("c2", "header").to_bytes()
    assert ConversationState.from_bytes(ConversationState.with_last_cache(none, hit)).last_cache == hit
