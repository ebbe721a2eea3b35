"""The gateway renders exactly what a real vLLM engine renders (vLLM CPU, shared/engine, started with
the gateway's own gateway/chat_templates/deepseek_v4.1.jinja): token ids, for every golden case.

Each golden request is turned into the body the gateway forwards on the engine lane of
tests/support/engine_proc.py (effort and thinking carried by `effort.apply_to_body`, as the hot path
does), then compared three ways:

* the gateway's renderer (the lane's options: vLLM request normalisation) ...
* ... against the engine's `/tokenize` (chat form), and
* ... against the engine's own chat path: POST /v1/chat/completions with `return_token_ids`, whose
  `prompt_token_ids` are what the engine actually prefilled (max_tokens 1).

vLLM's chat endpoint renames `reasoning_content` to `reasoning` before templating; its /tokenize
endpoint does not (the template would then see no reasoning), so the /tokenize body gets `reasoning`,
which is what the chat path hands the template. Every mismatch is listed with the first differing
token and the text around it; a case the engine refuses is skipped with the engine's reason (the tiny
test model is text-only, so image cases cannot be checked here).

Run alone: `make test-engine` or `pytest -m engine tests/test_engine_render.py`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import Lane
from gateway.conversations import effort as effort_mod
from gateway.render import Renderer, SegmentCache
from gateway.render.engines import template_response_format
from gateway.render.options import options_for_lane
from gateway.render.result import RenderOptions
from gateway.render.tokenizer import load_tokenizer
from tests.support.engine_proc import SHARED, EngineProc, engine_lane, http_json

GOLDEN = SHARED / "golden"
SINGLE = sorted((GOLDEN / "dsv41").glob("*.json"))
TURNS = sorted((GOLDEN / "dsv41_turns").glob("*.json"))



@pytest.fixture(scope="module")
def lane() -> Lane:
    return Lane.model_validate(engine_lane("http://127.0.0.1:9"))


@pytest.fixture(scope="module")
def renderer(lane: Lane) -> Renderer:
    return Renderer(options_for_lane(lane), cache=SegmentCache())


def forwarded(case: dict[str, Any], lane: Lane) -> tuple[dict[str, Any], RenderOptions]:
    """The body the gateway forwards for this golden request on the engine lane, and its render options."""
    body: dict[str, Any] = {"model": "ds", "messages": copy.deepcopy(case["messages"])}
    for m in body["messages"]:
        for tc in m.get("tool_calls") or []:  # OpenAI shape: arguments as a JSON string
            if not isinstance(tc["function"].get("arguments"), str):
                tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"], ensure_ascii=False)
            tc.setdefault("id", "")
    if case.get("tools"):
        body["tools"] = case["tools"]
    kwargs: dict[str, Any] = {"thinking": case["thinking"], "drop_thinking": case["drop_thinking"]}
    if case.get("response_format"):
        # On vLLM the template sees a response format only through chat_template_kwargs.
        kwargs["response_format"] = case["response_format"]
    if case["reasoning_effort"] is not None:
        kwargs["reasoning_effort"] = case["reasoning_effort"]
    body["chat_template_kwargs"] = kwargs
    choice = effort_mod.resolve(body, lane)
    effort_mod.apply_to_body(body, lane, choice.thinking, choice.effort)
    opts = dataclasses.replace(options_for_lane(lane), thinking=choice.thinking,
                               reasoning_effort=choice.effort if isinstance(choice.effort, int) else None,
                               drop_thinking=case["drop_thinking"])
    return body, opts




def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "model": "deepseek-v4-tiny", "max_tokens": 1, "temperature": 0, "return_token_ids": True,
            "stream": False}


def describe(name: str, path: str, engine_ids: list[int], gateway_ids: list[int]) -> str:
    tok = load_tokenizer(None)
    k = next((i for i, (a, b) in enumerate(zip(engine_ids, gateway_ids)) if a != b),
             min(len(engine_ids), len(gateway_ids)))
    lo = max(0, k - 6)
    return (f"{name} [{path}]: engine {len(engine_ids)} tokens, gateway {len(gateway_ids)}; first difference at "
            f"token {k}: engine {engine_ids[k:k + 4]} {tok.decode(engine_ids[lo:k + 10])!r} vs gateway "
            f"{gateway_ids[k:k + 4]} {tok.decode(gateway_ids[lo:k + 10])!r}")


def compare_case(engine: EngineProc, renderer: Renderer, lane: Lane, name: str, case: dict[str, Any],
                 chat: bool) -> tuple[list[str], list[str]]:
    """(mismatches, skips) of one golden request."""
    body, opts = forwarded(case, lane)
    ours = list(renderer.render(body, opts).token_ids)
    mismatches, skips = [], []
    ids = engine.tokenize_chat(body["messages"], tools=body.get("tools"), **body["chat_template_kwargs"])
    if isinstance(ids, str):
        skips.append(f"{name} [tokenize]: {ids[:200]}")
    elif ids != ours:
        mismatches.append(describe(name, "tokenize", ids, ours))
    if chat:
        status, out = http_json("POST", engine.url + "/v1/chat/completions", chat_body(body))
        if status != 200:
            skips.append(f"{name} [chat]: HTTP {status} {str(out)[:160]}")
        else:
            ids = out["prompt_token_ids"]
            if ids != ours:
                mismatches.append(describe(name, "chat", ids, ours))
            if out["usage"]["prompt_tokens"] != len(ours):
                mismatches.append(f"{name} [chat]: usage.prompt_tokens {out['usage']['prompt_tokens']} != {len(ours)}")
    return mismatches, skips


@pytest.mark.engine
def test_every_golden_case_renders_on_the_engine_as_the_gateway_predicts(engine, renderer, lane):
    requests = [(p.stem, json.loads(p.read_text()), True) for p in SINGLE]
    for p in TURNS:
        d = json.loads(p.read_text())
        requests += [(f"{p.stem}.turn1", d["turn1"], False), (f"{p.stem}.turn2", d["turn2"], False)]
    mismatches: list[str] = []
    skips: list[str] = []
    for name, case, chat in requests:
        mm, sk = compare_case(engine, renderer, lane, name, case, chat)
        mismatches += mm
        skips += sk
    n_tok = len(requests) - sum("[tokenize]" in s for s in skips)
    n_chat = len(SINGLE) - sum("[chat]" in s for s in skips)
    print(f"\nengine render parity: {n_tok}/{len(requests)} golden requests compared on /tokenize, "
          f"{n_chat}/{len(SINGLE)} on the chat path, {len(mismatches)} mismatches; skipped: {skips or 'none'}")
    assert not mismatches, "the engine renders differently:\n" + "\n".join(mismatches)
    # Only image cases may be refused, and only because the tiny model is text-only.
    assert all("not a multimodal model" in s for s in skips), skips
    assert n_tok >= len(requests) - 2 and n_chat >= len(SINGLE) - 1


# -- no engine needed ----------------------------------------------------------------------------


def test_vllm_lane_renders_response_format_only_from_template_kwargs(renderer, lane):
    """vLLM hands the template no top-level response_format (it drives guided decoding only)."""
    case = json.loads((GOLDEN / "dsv41" / "13_response_format.json").read_text())
    rf = case["response_format"]
    plain = {"messages": case["messages"]}
    top = {"messages": case["messages"], "response_format": rf}
    kw = {"messages": case["messages"], "response_format": rf, "chat_template_kwargs": {"response_format": rf}}
    opts = dataclasses.replace(options_for_lane(lane), thinking=case["thinking"],
                               drop_thinking=case["drop_thinking"])
    assert renderer.render(top, opts).prompt == renderer.render(plain, opts).prompt
    assert "## Response Format" in renderer.render(kw, opts).prompt
    sglang = dataclasses.replace(opts, engine="sglang")
    assert renderer.render(top, sglang).prompt == case["expected_prompt"]
    assert template_response_format("vllm", top) is None
    assert template_response_format("sglang", top) == rf


def test_forwarded_body_carries_effort_like_the_hot_path(lane):
    case = json.loads((GOLDEN / "dsv41" / "07_effort_int_37.json").read_text())
    body, opts = forwarded(case, lane)
    assert body["chat_template_kwargs"]["reasoning_effort"] == 37 and opts.reasoning_effort == 37
    assert "reasoning_effort" not in body  # no word maps to 37: only the template kwarg carries it
    case = json.loads((GOLDEN / "dsv41" / "06_effort_max.json").read_text())
    body, opts = forwarded(case, lane)
    # vLLM merges a top-level word over the template kwargs: the number alone is told (render/told.py).
    assert body["chat_template_kwargs"]["reasoning_effort"] == 100 and opts.reasoning_effort == 100
    assert "reasoning_effort" not in body


def test_golden_set_is_where_the_engine_tests_expect_it():
    assert len(SINGLE) >= 22 and len(TURNS) >= 15, f"golden vectors missing under {GOLDEN}"
    assert Path(SHARED / "engine" / "serve.sh").exists()
