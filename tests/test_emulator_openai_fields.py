"""The emulator honours n, logprobs/top_logprobs, response_format and counts reasoning in max_tokens."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.emulator_proc import run_emulator

MSGS = [{"role": "user", "content": "Tell me something."}]


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def client(request):
    with run_emulator(flavour=request.param, reasoning_tokens=5, default_thinking=True) as emu:
        yield openai.OpenAI(base_url=emu.base_url, api_key="x", max_retries=0, timeout=30)


def test_n_choices(client):
    r = client.chat.completions.create(model="m", messages=MSGS, n=3, max_tokens=9)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # different samples
    assert r.usage.completion_tokens == 27
    chunks = list(client.chat.completions.create(model="m", messages=MSGS, n=2, max_tokens=9, stream=True,
                                                 stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert set(texts) == {0, 1} and all(texts.values())
    assert chunks[-1].usage.completion_tokens == 18


def test_logprobs(client):
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=8, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp)
    streamed = [c for c in client.chat.completions.create(model="m", messages=MSGS, max_tokens=8, logprobs=True,
                                                          top_logprobs=2, stream=True)]
    entries = [t for c in streamed for ch in c.choices if ch.logprobs and ch.logprobs.content
               for t in ch.logprobs.content]
    assert entries and all(len(t.top_logprobs) == 2 for t in entries)


def test_response_format_json_object(client):
    r = client.chat.completions.create(model="m", messages=MSGS, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict) and r.choices[0].finish_reason == "stop"
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["city", "n"]}
    r = client.chat.completions.create(model="m", messages=MSGS, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj["city"], str) and isinstance(obj["n"], int)


def test_max_tokens_counts_reasoning(client):
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=7)
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=3)  # all of it goes to reasoning
    assert r.usage.completion_tokens == 3 and not r.choices[0].message.content
