"""The emulator's wire shapes against the real-format fixtures in ../shared/fixtures/upstream.

Shape = the JSON with every string/number replaced by its type: key sets, key order, nulls and
nesting must match the fixture chunk of the same kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.emulator_proc import EmulatorProc, run_emulator

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "upstream"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures not present")

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}


def shape(obj: Any) -> Any:
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]  # a list: key order counts
    if isinstance(obj, list):
        return [shape(v) for v in obj[:1]]
    if obj is None or isinstance(obj, bool):
        return obj
    return type(obj).__name__


def kind(chunk: dict[str, Any]) -> str:
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    delta = choice["delta"]
    if choice["finish_reason"]:
        return "finish"
    if delta.get("role"):
        return "role"
    if delta.get("tool_calls"):
        return "tool_head" if delta["tool_calls"][0].get("id") else "tool_args"
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    return "content"


def by_kind(chunks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in chunks:
        out.setdefault(kind(c), c)
    return out


def read_sse(path: Path) -> list[dict[str, Any]]:
    lines = [ln[6:] for ln in path.read_text().splitlines() if ln.startswith("data: ")]
    return [json.loads(ln) for ln in lines if ln != "[DONE]"]


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def emu(request: pytest.FixtureRequest) -> Iterator[tuple[str, EmulatorProc]]:
    with run_emulator(flavour=request.param, model="deepseek-v4-flash") as proc:
        yield request.param, proc


BODY = {
    "model": "deepseek-v4-flash",
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [TOOL],
    "chat_template_kwargs": {"thinking": True},
    "max_tokens": 12,  # counts the 8 reasoning tokens too
}


async def _post(url: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, Any, str]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body) as r:
            return r.status, await r.read(), r.headers.get("Content-Type", "")


async def test_stream_chunks_match_fixture(emu: tuple[str, EmulatorProc]) -> None:
    fl, proc = emu
    proc.reset()
    body = dict(BODY, stream=True, stream_options={"include_usage": True})
    await _post(proc.url, body)  # warm the cache: the usage chunk then carries cached tokens like the fixture
    status, raw, ctype = await _post(proc.url, body)
    assert status == 200 and ctype.startswith("text/event-stream")
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n") and "\n\n\n" not in text
    ours = by_kind([json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")])
    theirs = by_kind(read_sse(FIXTURES / f"{fl}_stream_deepseek.sse"))
    assert set(ours) == set(theirs)
    for k in theirs:
        assert shape(ours[k]) == shape(theirs[k]), k


@pytest.mark.parametrize("name", ["nonstream_deepseek"])
async def test_nonstream_matches_fixture(emu: tuple[str, EmulatorProc], name: str) -> None:
    fl, proc = emu
    proc.reset()
    await _post(proc.url, BODY)
    status, raw, _ = await _post(proc.url, BODY)
    assert status == 200
    assert shape(json.loads(raw)) == shape(json.loads((FIXTURES / f"{fl}_{name}.json").read_text()))


async def test_models_match_fixture(emu: tuple[str, EmulatorProc]) -> None:
    fl, proc = emu
    async with aiohttp.ClientSession() as s:
        async with s.get(proc.url + "/v1/models") as r:
            ours = await r.json()
    theirs = json.loads((FIXTURES / f"{fl}_models.json").read_text())
    assert shape(ours) == shape(theirs)
    assert ours["data"][0]["root"] == theirs["data"][0]["root"]


async def test_errors_match_fixtures(emu: tuple[str, EmulatorProc]) -> None:
    fl, proc = emu
    proc.reset()
    proc.configure(max_images=4, max_model_len=65536)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": [image] * 5}]}
    status, raw, _ = await _post(proc.url, body)
    assert status == 400
    assert json.loads(raw) == json.loads((FIXTURES / f"{fl}_error_too_many_images.json").read_text())

    top = 21 if fl == "vllm" else 200000
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
            "top_logprobs": top}
    status, raw, _ = await _post(proc.url, body)
    assert status == 400
    assert json.loads(raw) == json.loads((FIXTURES / f"{fl}_error_top_logprobs_too_large.json").read_text())

    proc.configure(max_images=None)
    # 65537 prompt tokens in the simple tokenizer: BOS, user header, 65533 words, EOT, assistant header.
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "x " * 65533}]}
    status, raw, _ = await _post(proc.url, body)
    assert status == 400
    name = "error_context_too_long" if fl == "vllm" else "error_context_too_long_input_only"
    assert json.loads(raw) == json.loads((FIXTURES / f"{fl}_{name}.json").read_text())

    if fl == "sglang":  # prompt fits; prompt + completion reaches the limit, which SGLang already refuses
        body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "x " * 61436}],
                "max_tokens": 4096}
        status, raw, _ = await _post(proc.url, body)
        assert status == 400
        ours, theirs = json.loads(raw), json.loads((FIXTURES / "sglang_error_context_too_long.json").read_text())
        assert shape(ours) == shape(theirs)
        assert ours["message"].startswith("Requested token count exceeds the model's maximum context length of 65536 "
                                          "tokens. You requested a total of 65536 tokens: 61440 tokens from the input "
                                          "messages and 4096 tokens")


async def test_midstream_error_matches_fixture(emu: tuple[str, EmulatorProc]) -> None:
    fl, proc = emu
    async with aiohttp.ClientSession() as s:
        async with s.post(proc.url + "/v1/chat/completions", json=dict(BODY, stream=True),
                          headers={"X-Emulator-Config": json.dumps({"error_after_chunks": 1})}) as r:
            text = (await r.read()).decode()
    events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 3
    theirs = read_sse(FIXTURES / f"{fl}_error_midstream.sse")[0]
    assert shape(json.loads(events[1])) == shape(theirs)
