#!/usr/bin/env python3
"""The conversation path on a real long agent session (../shared/tools/make_agent_corpus.py).

1. Hot path: added latency of the gateway for the full ~1,600-message corpus body, paired against
   direct access to the same stub in one run (the gateway parses, identifies the conversation,
   pins effort and forwards; analysis runs after the response).
2. Analysis: how long after a response's end the turn's analysis (render, tokenize, compare,
   store) has landed, and the state kept per conversation, for an append-only agent continuing
   the corpus and for a client replaying the corpus's own turns (each one a drift).

    python bench/conversation.py [--turns 12] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.emulator_proc import run_emulator  # noqa: E402
from tests.support.gateway_proc import free_port, run_gateway, wait_http  # noqa: E402

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))


def corpus(path: Path) -> dict:
    if not path.exists():
        subprocess.run([sys.executable, str(SHARED / "tools" / "make_agent_corpus.py"), "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def routes(url: str, model: str) -> dict:
    lane = {"engine": "vllm", "replicas": [url], "upstream_model": model, "qualification": "not_required",
            "cache": {"block_size": 16}, "routing": "round_robin"}
    return {"gateway": {"max_request_bytes": 64 << 20}, "lanes": {"ds": lane}, "models": {model: "ds"}}


async def paired(direct: str, gw: str, body: bytes, rounds: int) -> tuple[list[float], list[float]]:
    d, g = [], []
    async with aiohttp.ClientSession() as s:
        async def once(url: str) -> float:
            t0 = time.perf_counter()
            async with s.post(url + "/v1/chat/completions", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
                assert r.status == 200, r.status
            return (time.perf_counter() - t0) * 1000
        for _ in range(3):
            await once(direct), await once(gw)
        for i in range(rounds):  # ABBA order: drifts of the shared machine hit both alike
            for url, out in ((direct, d), (gw, g)) if i % 2 == 0 else ((gw, g), (direct, d)):
                out.append(await once(url))
    return d, g


def hot_path(body: dict, rounds: int) -> None:
    port = free_port()
    mock = subprocess.Popen([sys.executable, str(SHARED / "tools" / "mock_upstream.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/v1/models", 10)
        req = dict(body, model="mock-model", max_tokens=16, stream=False)
        data = json.dumps(req).encode()
        with run_gateway(routes(url, "mock-model")) as gw:
            d, g = asyncio.run(paired(url, gw.url, data, rounds))
    finally:
        mock.terminate()
    dp, gp = statistics.median(d), statistics.median(g)
    diffs = sorted(b - a for a, b in zip(d, g))
    print(f"hot path, corpus body {len(data) / 1e6:.2f} MB, {len(body['messages'])} messages, {rounds} paired rounds:")
    print(f"  direct p50 {dp:.2f} ms, gateway p50 {gp:.2f} ms, added p50 {gp - dp:.2f} ms "
          f"(paired diff median {statistics.median(diffs):.2f} ms), ratio x{gp / dp:.2f}")


def assistant_ends(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def analysis(body: dict, turns: int) -> None:
    """Two clients on the corpus, each after a cold first turn of the whole session:

    * append-only (an agent as it should be): each turn appends exactly what the model answered,
      then a short user message; every turn is a cache hit and its analysis is incremental;
    * replayed: the corpus's own next turns, which are not what the model answered, so each turn
      drifts at the answer (the slower path: the break is located, explained and quoted).
    """
    import httpx

    messages = body["messages"]
    ends = assistant_ends(messages)
    extra = {k2: v for k2, v in body.items() if k2 not in ("messages", "model")}
    with run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, block_size=16,
                      max_model_len=1 << 20) as emu:
        with run_gateway(routes(emu.url, "deepseek-v4-flash")) as gw:
            client = httpx.Client(timeout=300)

            own: list[float] = []  # the analyzer's own measure: from its start to the state stored

            def turn(msgs: list[dict], key: str) -> tuple[dict, float, dict]:
                req = dict(extra, model="deepseek-v4-flash", messages=msgs, max_tokens=8, stream=False)
                r = client.post(gw.url + "/v1/chat/completions", json=req, headers={"X-Conversation-Id": key})
                t_end = time.perf_counter()
                r.raise_for_status()
                cid = r.headers["x-gateway-conversation"].split(";")[0]
                n = int(r.headers["x-gateway-conversation"].split("turn=")[1].split(";")[0])
                while True:
                    st = client.get(f"{gw.url}/admin/conversations/{cid}").json()
                    if st.get("turn", 0) >= n:
                        break
                    time.sleep(0.002)
                ms = (time.perf_counter() - t_end) * 1000
                own.append(client.get(gw.url + "/admin/api/overview").json()["aftermath"]["analysis_last_ms"])
                return st, ms, r.json()["choices"][0]["message"]

            for mode in ("append-only", "replayed"):
                lat, sizes, verdicts, own = [], [], [], []
                if mode == "append-only":
                    history = messages[:ends[-1]]
                    st, ms, answer = turn(history, mode)
                    print(f"  cold first turn: {st['prompt_tokens']} tokens analysed {ms:.0f} ms after the response")
                    for k in range(turns):
                        said = {"role": "assistant", "content": answer.get("content") or ""}
                        if answer.get("reasoning") or answer.get("reasoning_content"):
                            said["reasoning_content"] = answer.get("reasoning") or answer.get("reasoning_content")
                        if answer.get("tool_calls"):
                            said["tool_calls"] = answer["tool_calls"]
                        history = [*history, said, {"role": "user", "content": f"Step {k}: go on."}]
                        st, ms, answer = turn(history, mode)
                        lat.append(ms), sizes.append(st["state_bytes"]), verdicts.append(st["last_cache"]["verdict"])
                else:
                    for end in ends[-turns - 1:]:
                        st, ms, _ = turn(messages[:end], mode)
                        lat.append(ms), sizes.append(st["state_bytes"]), verdicts.append(st["last_cache"]["verdict"])
                    lat, sizes, verdicts = lat[1:], sizes[1:], verdicts[1:]  # the first is the cold render
                own = own[-len(lat):]
                print(f"analysis after the response, {mode}, {len(lat)} turns ({st['prompt_tokens']} tokens): "
                      f"p50 {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms (the analyzer's own p50 "
                      f"{statistics.median(own):.1f} ms); state {max(sizes) / 1024:.1f} KB; "
                      f"verdicts {dict((v, verdicts.count(v)) for v in set(verdicts))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/agent.json")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--turns", type=int, default=12)
    a = ap.parse_args()
    body = corpus(Path(a.corpus))
    hot_path(body, a.rounds)
    analysis(body, a.turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
