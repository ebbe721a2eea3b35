"""Where a turn's analysis runs (gateway/conversations/inline.py): a tiny turn on a quiet lane on the
event loop, the rest in the worker process, with the same verdicts either way."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from gateway.conversations.analysis import analyse_job
from gateway.conversations.job import Job
from gateway.conversations.state import ConversationState
from gateway.conversations.worker import AnalysisProcess
from gateway.core.verdict import CacheVerdict
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

from tests.support.conversations import Agent
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.routes import agent_routes


def _aftermath(gw) -> dict:
    return httpx.get(gw.url + "/admin/api/overview").json()["aftermath"]


def test_an_agent_hits_every_turn_on_the_loop_then_in_the_worker_once_it_grows(agent_emu) -> None:
    """Its first turns are tiny (analysed inline); its history grows past the bound and the worker
    takes over with no memo of the conversation: each turn still hits, predicted == reported."""
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw)
        agent.cold_then_hits(0)
        first = _aftermath(gw)
        assert first["analysis_inline"] == 1 and first["analysis_batches"] == 0, first
        for _ in range(40):
            if _aftermath(gw)["analysis_batches"] >= 2:
                break
            _, cache = agent.turn()
            assert cache["verdict"] == "hit", cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache
        last = _aftermath(gw)
        assert last["analysis_batches"] >= 2 and last["analysis_inline"] >= 2, last
        assert last["analysis_failures"] == 0 and last["analysed"] == agent.turns, last


def test_a_conversation_that_moves_to_the_worker_keeps_its_drift_causes(agent_emu) -> None:
    """Without tools the template drops each previous answer's reasoning: every turn drifts, by a cause
    named token by token. The turns analysed on the loop, then the one that outgrows the bound and
    moves to the worker (with the previous render's ids: without them it read `unknown`), then the
    worker's: the same cause, the prediction equal to the engine's count."""
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw, tools=False)
        agent.turn()
        while _aftermath(gw)["analysis_batches"] < 2:
            assert agent.turns < 40, _aftermath(gw)
            _, cache = agent.turn()
            assert (cache["verdict"], cache["cause"]) == ("drift", "reasoning_dropped_by_template"), cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"], cache
        done = _aftermath(gw)
        assert done["analysis_inline"] >= 2 and done["analysis_failures"] == 0, done


def test_a_turn_that_ends_while_the_lane_is_busy_goes_to_the_worker() -> None:
    """A turn that ends while another of its lane is in flight leaves the event loop to the requests."""
    # 24 tokens at 4 a second: the long turn is in flight for ~6 s, while the worker, used for the
    # first time, loads its tokenizer (~0.5-2 s) and analyses the short one.
    with run_emulator(**{**AGENT_EMULATOR, "decode_tps": 4}) as emu, run_gateway(agent_routes(emu.url)) as gw, \
            httpx.Client(base_url=gw.url, timeout=30) as client:
        def body(i: int, n: int) -> dict:
            return {"model": "ds", "messages": [{"role": "user", "content": f"Say hello, {i}."}], "max_tokens": n}

        with client.stream("POST", "/v1/chat/completions", json={**body(1, 24), "stream": True}) as long:
            lines = long.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # in flight
            assert client.post("/v1/chat/completions", json=body(2, 1)).status_code == 200
            wait_until(lambda: _aftermath(gw)["analysed"] == 1, what="the short turn's analysis")
            assert _aftermath(gw)["analysis_batches"] == 1
            assert any(line == "data: [DONE]" for line in lines)
        wait_until(lambda: _aftermath(gw)["analysed"] == 2, what="the long turn's analysis")
        done = _aftermath(gw)
        assert done["analysis_inline"] == 1 and done["analysis_batches"] == 1 and done["analysis_failures"] == 0, done


def test_the_bound_can_be_turned_off(agent_emu) -> None:
    with run_gateway(agent_routes(agent_emu.url), env={"GATEWAY_ANALYSIS_INLINE_BYTES": "0"}) as gw:
        Agent(gw).cold_then_hits(1)
        done = _aftermath(gw)
        assert done["analysis_inline"] == 0 and done["analysis_batches"] == 2, done


def test_an_agents_turns_get_the_same_verdicts_here_and_in_the_worker() -> None:
    """The same turns, chained through their stored states, analysed in this process (as inline does:
    analyse_job with the lane's renderer) and in a worker process: the same verdicts, field by field."""
    options = RenderOptions(thinking=True, engine="vllm")
    usage = {"prompt_tokens": 30, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 16}}

    def turns() -> list[tuple[list[dict], dict]]:
        history: list[dict] = [{"role": "system", "content": "You are an agent."}]
        out = []
        for k in range(6):
            history = [*history, {"role": "user", "content": f"Step {k}: go on."}]
            said = {"role": "assistant", "content": f"Did step {k}.", "reasoning_content": f"Step {k} is easy."}
            out.append((history, said))
            # turn 3 sends its answer back without its reasoning (which the template drops anyway)
            history = [*history, said if k != 3 else {"role": "assistant", "content": said["content"]}]
        return out

    def job(messages: list[dict], said: dict, stored: bytes | None, state: ConversationState) -> Job:
        body = orjson.dumps({"model": "m", "messages": messages, "max_tokens": 16})
        j = Job("r", "l", options, options, 16, "vllm", 5000.0, body, said, "stop", usage, True, None, None, None,
                False, False, state)
        j.stored = stored
        return j

    async def chain(run) -> list[CacheVerdict]:
        stored, state, verdicts = None, ConversationState("c1", "key"), []
        for messages, said in turns():
            outcome = await run(job(messages, said, stored, state))
            stored, state = outcome.data, ConversationState.from_bytes(outcome.data)
            verdicts.append(outcome.cache)
        return verdicts

    async def both() -> tuple[list[CacheVerdict], list[CacheVerdict]]:
        renderer = Renderer(options)

        async def here(j: Job) -> object:
            return analyse_job(j, renderer, None)

        process = AnalysisProcess()
        process.start([options])
        try:
            return await chain(here), await chain(process.run)
        finally:
            process.stop()

    here, there = asyncio.run(both())
    assert here == there
    assert ([(v.verdict, v.cause) for v in here]
            == [("cold", None)] + [("drift", "reasoning_dropped_by_template")] * 5)
    assert len({v.predicted_cached_tokens for v in here}) == 6, here
