"""The unchanged history recognised from its bytes (conversations/rawbody.py, memo.py, the renderer's
`previous`) gives exactly what the full path gives: the body, the render, the verdict, LCP, predicted
cached tokens, cause, snippets and the state kept.

Each case analyses turn 1 then turn 2 of a conversation twice, each time with its own render cache:
once as the worker process does (the forwarded bytes, the previous turn's memo), once as the full
path (the parsed body: no bytes to recognise, no memo). The turns come from the drift fuzzer's
generated conversations and labelled mutations (tests/support/drift_fuzz.py: edits in the middle,
to the last message, tools, effort, thinking, response_format), and from longer append-only runs.
"""

from __future__ import annotations

import copy
import json
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.conversations import rawbody
from gateway.conversations.analysis import analyse_job
from gateway.conversations.job import Job
from gateway.conversations.memo import memos
from gateway.conversations.state import ConversationState
from gateway.render.cache import SegmentCache
from gateway.render.estimate import Estimator
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions
from tests.support.drift_fuzz import MUTATIONS, Scenario, scenarios, sent_back

EXAMPLES = 300


def _job(cid: str, body: dict, options: RenderOptions, engine: str, output: dict, state: ConversationState,
         stored: bytes | None, as_bytes: bool) -> Job:
    usage = {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 32}}
    job = Job("r", "lane", options, options, 16, engine, 5000.0,
              orjson.dumps(body) if as_bytes else copy.deepcopy(body), output, "stop", usage, options.thinking,
              options.reasoning_effort, None, None, False, False, state)
    job.stored = stored
    return job


def _view(data: bytes) -> dict:
    d = orjson.loads(data)
    d.pop("u"), d.pop("c")  # timestamps
    return d


def _turns(cid: str, turns: list[tuple[dict, RenderOptions, dict]], engine: str, as_bytes: bool,
           budget: int | None = None, estimated: bool = False) -> list:
    """Analyse the turns in order with a fresh render cache; (cache, state, divergence, snippets) each.
    `estimated`: as on a lane without a template (render/estimate.py)."""
    cache = SegmentCache(budget) if budget else SegmentCache()
    renderer = None if estimated else Renderer(RenderOptions(engine=engine), cache=cache)
    estimator = Estimator(engine=engine, cache=cache) if estimated else None
    state, stored, out = ConversationState(cid, "key"), None, []
    for body, options, output in turns:
        outcome = analyse_job(_job(cid, body, options, engine, output, state, stored, as_bytes), renderer, estimator)
        out.append((outcome.cache, _view(outcome.data), outcome.divergence, outcome.snippets))
        stored = outcome.data
        state = ConversationState.from_bytes(stored)
    return out


def _same_as_full_path(turns: list[tuple[dict, RenderOptions, dict]], engine: str, budget: int | None = None,
                       estimated: bool = False) -> None:
    memos().clear()
    fast = _turns("fast", turns, engine, as_bytes=True, budget=budget, estimated=estimated)
    # Against the full path with every earlier segment's tokens at hand: a cache too small for the
    # history must not change the fast path's answer (the ids its last render holds stay findable).
    full = _turns("full", turns, engine, as_bytes=False, budget=None, estimated=estimated)
    for k, (a, b) in enumerate(zip(fast, full)):
        assert a[0] == b[0], (k, a[0], b[0])  # verdict, LCP, predicted, cause, ...
        assert {**a[1], "id": None} == {**b[1], "id": None}, k  # the state kept, fingerprints included
        assert a[2] == b[2] and a[3] == b[3], k  # divergence, snippets


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_reused_history_gives_the_full_paths_results(data: st.DataObject) -> None:
    s: Scenario = data.draw(scenarios(), label="scenario")
    names = sorted(n for n, (applies, _, _) in MUTATIONS.items() if applies(s))
    name = data.draw(st.sampled_from(names), label="mutation")
    MUTATIONS[name][1](s, data.draw)
    turns = [(s.body(1), s.options(1), s.output), (s.body(2), s.options(2), s.output)]
    _same_as_full_path(turns, s.engine, estimated=data.draw(st.booleans(), label="estimated"))


def _agent(rng: random.Random, n: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You are a careful agent. Ω"}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"step {i}: " + " ".join(rng.choice(["fix", "the", "файл", "bug"])
                                                                           for _ in range(rng.randint(1, 12)))})
        msgs.append({"role": "assistant", "content": f"done {i}", "reasoning_content": f"think {i}"})
    return msgs


@pytest.mark.parametrize("lane", ["template", "estimated"])
@pytest.mark.parametrize("budget", [None, 24_000], ids=["cache", "evicting"])  # a small cache evicts the history
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("edit", ["append", "middle", "last", "tools", "effort", "thinking", "reorder_keys"])
def test_append_only_runs_and_edits(engine: str, edit: str, budget: int | None, lane: str) -> None:
    rng = random.Random(f"{engine}-{edit}")
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    history = _agent(rng, 30)
    turns = []
    for t in range(6):
        out = {"role": "assistant", "content": f"answer {t}", "reasoning_content": f"why {t}"}
        body: dict = {"model": "m", "messages": copy.deepcopy(history), "max_tokens": 8}
        options = RenderOptions(thinking=True, reasoning_effort="high", engine=engine)
        if t == 4:  # the edit, on one turn in the middle of the run
            if edit == "middle":
                body["messages"][11]["content"] += " (edited)"
            elif edit == "last":
                body["messages"][-1]["content"] += " (edited)"
            elif edit == "tools":
                body["tools"] = tools
            elif edit == "effort":
                options = RenderOptions(thinking=True, reasoning_effort="low", engine=engine)
            elif edit == "thinking":
                options = RenderOptions(thinking=False, engine=engine)
            elif edit == "reorder_keys":
                body = {"max_tokens": 8, "messages": body["messages"], "model": "m"}
        turns.append((body, options, out))
        history = [*history, sent_back(out), {"role": "user", "content": f"next {t}"}]
    _same_as_full_path(turns, engine, budget, estimated=lane == "estimated")
    assert memos().hits == 5, "every turn after the first found its previous turn's memo"


@pytest.mark.parametrize("dumps", [
    lambda b: orjson.dumps(b),
    lambda b: json.dumps(b).encode(),  # ", " and ": ", \\u escapes
    lambda b: json.dumps(b, indent=2, ensure_ascii=False).encode(),
])
def test_body_bytes_read_as_orjson_reads_them(dumps) -> None:
    rng = random.Random(7)
    msgs = _agent(rng, 10)
    first = dumps({"model": "m", "messages": msgs, "stream": False})
    a = rawbody.read(first)
    assert a is not None and a.body == orjson.loads(first) and a.unchanged == 0
    grown = dumps({"model": "m", "messages": [*msgs, {"role": "user", "content": "more"}], "stream": False})
    b = rawbody.read(grown, a.print, a.body["messages"])
    assert b is not None and b.body == orjson.loads(grown) and b.unchanged == len(msgs)
    edited = copy.deepcopy(msgs)
    edited[5]["content"] = "changed"
    c = rawbody.read(dumps({"messages": edited, "model": "m"}), b.print, b.body["messages"])
    assert c is not None and c.body == {"messages": edited, "model": "m"} and c.unchanged == 5


@pytest.mark.parametrize("data", [
    b'{"messages":[{"role":"user","content":"a"}],"messages":[]}',  # a second messages key: orjson decides
    b'{"messages":{"role":"user"}}',
    b'[1,2]',
    b'{"messages":[{"role":"user","content":"a"}]} x',
])
def test_odd_bodies_are_left_to_the_full_parse(data: bytes) -> None:
    assert rawbody.read(data) is None


@pytest.mark.parametrize("head_ahead", [False, True], ids=["stored-current", "head-ahead"])
def test_a_job_sent_without_the_previous_print_reads_it_from_the_stored_state(head_ahead: bool) -> None:
    """The analysis process gets the hot path's state without its previous turn's print (the print is
    in `stored`, sent once): the outcome is the one the whole state gives, also when the head (written
    at the response's end) is ahead of the stored state, as when analysis lags."""
    import dataclasses

    rng = random.Random(7)
    history = _agent(rng, 6)
    options = RenderOptions(thinking=True, reasoning_effort="high", engine="vllm")
    out = {"role": "assistant", "content": "answer", "reasoning_content": "why"}
    first = {"model": "m", "messages": history, "max_tokens": 8}
    second = {"model": "m", "messages": [*history, sent_back(out), {"role": "user", "content": "next"}],
              "max_tokens": 8}
    views = []
    for slim in (False, True):
        memos().clear()
        renderer = Renderer(RenderOptions(engine="vllm"), cache=SegmentCache())
        stored = analyse_job(_job("c", first, options, "vllm", out, ConversationState("c", "key"), None, True),
                             renderer, None).data
        state = ConversationState.from_bytes(stored)
        if head_ahead:
            state.turn += 1
        job = _job("c", second, options, "vllm", out, state, stored, True)
        if slim:
            job.state, job.last_in_stored = dataclasses.replace(state, last=None, last_cache=None), True
        memos().clear()  # as after a worker restart: the print comes from the bytes, not the memo
        outcome = analyse_job(job, renderer, None)
        views.append((outcome.cache, {**_view(outcome.data), "lc": None}, outcome.divergence))
    assert views[0] == views[1]
    assert views[1][0].verdict != "cold", "compared with the previous turn"
