"""Conversations end to end: the emulator's real prefix cache (the DeepSeek renderer and tokenizer)
behind the real gateway, driven like an agent with the official openai client."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai

from tests.support.conversations import SYSTEM, TOOLS, Agent
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.latency_proxy import latency_proxy
from tests.support.poll import wait_until
from tests.support.redis_proc import run_redis
from tests.support.routes import agent_routes

def test_append_only_agent_hits_every_turn_and_predictions_match(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw)
        for cache in agent.cold_then_hits(7)[1:]:
            assert cache["render_matches_engine"], cache


def test_non_streaming_turns_are_tracked_too(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw, stream=False)
        agent.turn()
        for _ in range(3):
            _, cache = agent.turn()
            assert (cache["verdict"] == "hit"
                    and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]), cache


def test_effort_change_is_pinned(agent_emu):
    with run_gateway(agent_routes(agent_emu.url, effort_policy="pin")) as gw:
        agent = Agent(gw, reasoning_effort="high")
        h, _ = agent.turn()
        assert h["x-gateway-effort"] == "50"
        agent.turn()
        h, cache = agent.turn(reasoning_effort="max")
        assert h["x-gateway-effort"] == "50; requested=100; pinned"
        assert cache["verdict"] == "hit"


def test_effort_change_under_warn_is_drift_and_the_engine_agrees(agent_emu):
    with run_gateway(agent_routes(agent_emu.url, effort_policy="warn")) as gw:
        agent = Agent(gw, reasoning_effort="high")
        agent.turn()
        agent.turn()
        h, cache = agent.turn(reasoning_effort="max")
        assert h["x-gateway-effort"] == "100; pinned=50; warned"
        assert cache["verdict"] == "drift" and cache["cause"] == "effort_changed"
        assert cache["divergence_message_index"] == 0
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]
        assert cache["tokens_lost"] > 0
        alerts = httpx.get(gw.url + "/admin/drift", params={"cause": "effort_changed"}).json()["alerts"]
        assert alerts and alerts[0]["conversation"] == agent.cid and alerts[0]["tokens_lost"] > 0
        # The same alert in the terminal: `gateway drift`.
        table = subprocess.run([sys.executable, "-m", "gateway.cli", "drift", "--url", gw.url],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0 and "effort_changed" in table.stdout and agent.cid in table.stdout


def test_repin_header_accepts_the_change(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw, reasoning_effort="high")
        agent.turn()
        h, cache = agent.turn(reasoning_effort="max", extra_headers={"X-Gateway-Repin": "1"})
        assert h["x-gateway-effort"] == "100; requested=100; repinned"
        assert cache["verdict"] == "drift" and cache["cause"] == "effort_changed" and cache["repinned"]
        h, cache = agent.turn(reasoning_effort="max")
        assert h["x-gateway-effort"] == "100" and cache["verdict"] == "hit"


def test_chat_without_tools_drops_reasoning(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw, tools=False)
        agent.turn()
        _, cache = agent.turn()
        assert cache["verdict"] == "drift" and cache["cause"] == "reasoning_dropped_by_template"
        assert cache["divergence_message_index"] == 1
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]


def test_client_stripping_reasoning_is_named(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw)
        agent.turn()
        agent.turn()
        for m in agent.messages:
            m.pop("reasoning_content", None)
        _, cache = agent.turn()
        assert cache["cause"] == "client_stripped_reasoning"
        assert cache["divergence_message_index"] == 2


def test_explicit_key_wins_and_separates_agents(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        a, b = Agent(gw, user="alice"), Agent(gw, user="bob")
        a.turn()
        b.turn()
        assert a.cid != b.cid
        h, _ = a.turn()
        assert h["x-gateway-conversation"].endswith("via=user")


def test_lineage_separates_agents_with_the_same_start(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        a, b = Agent(gw), Agent(gw)
        a.turn()
        b.messages[1]["content"] += " Use the second approach."
        b.turn()
        assert a.cid != b.cid
        a.turn()
        b.turn()
        assert a.cid != b.cid


def test_small_cache_pool_gives_eviction_not_drift():
    with run_emulator(**AGENT_EMULATOR, cache_blocks=40) as emu:
        with run_gateway(agent_routes(emu.url)) as gw:
            agents = [Agent(gw, user=f"agent-{i}") for i in range(3)]
            for ag in agents:
                ag.messages[1]["content"] += " " + ("padding text " * 60) + ag.kw["user"]
            verdicts = []
            for _ in range(3):
                for ag in agents:
                    _, cache = ag.turn()
                    verdicts.append(cache["verdict"])
            assert "eviction" in verdicts
            assert "drift" not in verdicts


def test_redis_shared_between_two_gateways(agent_emu):
    with run_redis() as port:
        env = {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        _two_gateways_one_conversation(agent_emu, env)


def _two_gateways_one_conversation(agent_emu, env: dict) -> None:
    cfg = agent_routes(agent_emu.url)
    with run_gateway(cfg, env=env) as g1, run_gateway(cfg, env=env) as g2:
        agent = Agent(g1, reasoning_effort="high")
        agent.turn()
        agent.gw = g2
        agent.client = openai.OpenAI(base_url=g2.base_url, api_key="x", max_retries=0)
        h, cache = agent.turn(reasoning_effort="max")
        assert h["x-gateway-effort"] == "50; requested=100; pinned"
        assert cache["verdict"] == "hit"
        agent.gw = g1
        agent.client = openai.OpenAI(base_url=g1.base_url, api_key="x", max_retries=0)
        _, cache = agent.turn()
        assert cache["verdict"] == "hit"


def test_a_client_switching_gateways_the_moment_an_answer_ends_stays_in_its_conversation(agent_emu):
    """The turn-end write (head and anchors) finishes before the answer's last byte: a client that
    sends its next turn to the other gateway as soon as the stream ends is found there, every turn,
    even when one gateway's store is far (its writes land 80 ms late)."""
    cfg = agent_routes(agent_emu.url)
    with run_redis() as port, latency_proxy(port, 0.08) as far:
        with run_gateway(cfg, env={"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{far}/0"}) as g1, \
                run_gateway(cfg, env={"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as g2:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Switch gateways."}]
            for turn in range(1, 9):
                gw = (g1, g2)[turn % 2]
                content = reasoning = ""
                body = {"model": "ds", "messages": messages, "max_tokens": 16, "stream": True}
                with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as r:
                    assert r.status_code == 200
                    header = r.headers["x-gateway-conversation"]
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            for ch in json.loads(line[6:]).get("choices") or ():
                                content += ch["delta"].get("content") or ""
                                reasoning += ch["delta"].get("reasoning") or ch["delta"].get("reasoning_content") or ""
                assert f"turn={turn};" in header and (turn == 1 or "via=lineage" in header), (turn, header)
                messages += [{"role": "assistant", "content": content, "reasoning": reasoning},
                             {"role": "user", "content": f"Step {turn}."}]


def test_conversation_state_is_small(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw)
        for _ in range(4):
            agent.turn()
        state = httpx.get(f"{gw.url}/admin/conversations/{agent.cid}").json()
        per_message = state["state_bytes"] / len(agent.messages)
        assert per_message < 200, json.dumps(state)


def test_render_cli_shows_what_the_engine_sees(tmp_path):
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": "Hello"}], "tools": TOOLS}))
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "render", str(req), "--lane", "dsv41-vllm",
                          "--routes", "routes.yaml"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 50")
    summary = subprocess.run([sys.executable, "-m", "gateway.cli", "render", str(req), "--lane", "dsv41-vllm",
                              "--routes", "routes.yaml", "--summary"], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "tokens" in summary.stdout


def _analysis_worker(gw) -> int:
    """The pid of the gateway's analysis worker (a spawned child process)."""
    def spawned() -> int | None:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _child_of(proc, gw.proc.pid):
                with contextlib.suppress(OSError):
                    if b"spawn_main" in (proc / "cmdline").read_bytes():
                        return int(proc.name)
        return None

    return wait_until(spawned, what="the gateway's analysis worker process", interval=0.1)


def test_analysis_worker_death_is_noticed_at_once_and_a_new_worker_takes_over(agent_emu):
    """The gateway hears the worker die from its process sentinel, not at the next job: a worker that
    dies idle costs no verdict (a job in its hands would fail as "analysis failed"). Every turn goes
    to the worker here: a tiny turn on a quiet lane would be analysed on the event loop (inline.py)."""
    with run_gateway(agent_routes(agent_emu.url), env={"GATEWAY_ANALYSIS_INLINE_BYTES": "0"}) as gw:
        agent = Agent(gw)
        assert agent.turn()[1]["verdict"] == "cold"
        assert agent.turn()[1]["verdict"] == "hit"
        worker = _analysis_worker(gw)
        os.kill(worker, signal.SIGKILL)
        # No job is sent meanwhile: only the process sentinel can tell the gateway.
        wait_until(lambda: httpx.get(gw.url + "/admin/api/overview").json()["aftermath"]["analysis_worker_deaths"] == 1,
                   what="the worker's death noticed without a job")
        assert "worker process died" in gw.log()
        assert "gateway_analysis_worker_deaths_total 1.0" in httpx.get(gw.url + "/metrics").text
        # A new worker analyses the next turn against the last stored state (turn 2's): a hit.
        headers, cache = agent.turn()
        assert headers["x-gateway-conversation"].startswith(agent.cid)
        assert cache["verdict"] == "hit", cache
        assert 0 < cache["predicted_cached_tokens"] <= cache["reported_cached_tokens"], json.dumps(cache)
        overview = httpx.get(gw.url + "/admin/api/overview").json()["aftermath"]
        assert overview["analysis_failures"] == 0, overview
        assert _analysis_worker(gw) != worker and overview["analysis_worker_pid"] != worker


def test_analysis_in_threads_when_asked(agent_emu):
    with run_gateway(agent_routes(agent_emu.url), env={"GATEWAY_ANALYSIS": "thread"}) as gw:
        agent = Agent(gw)
        assert agent.turn()[1]["verdict"] == "cold"
        _, cache = agent.turn()
        assert cache["verdict"] == "hit" and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _child_of(p, gw.proc.pid)]


def _child_of(proc: Path, pid: int) -> bool:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
    except (OSError, IndexError, ValueError):
        return False


def test_analysis_worker_leaves_when_the_gateway_is_killed(agent_emu):
    before = set(Path("/dev/shm").glob("gateway-analysis-*"))  # a process of the same pid may have left one
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        worker = _analysis_worker(gw)
        gw.proc.kill()
        gw.proc.wait(10)
        wait_until(lambda: not Path(f"/proc/{worker}").exists(), what="the orphaned analysis worker to leave",
                   interval=0.1)
        left = set(Path("/dev/shm").glob(f"gateway-analysis-{gw.proc.pid}-*")) - before
        assert not left, "the spool directory is left"


def test_large_turns_go_to_the_worker_through_shared_memory_that_is_removed(agent_emu):
    before = set(Path("/dev/shm").glob("gateway-analysis-*"))  # a process of the same pid may have left one
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        # Answers end on their own (not cut at max_tokens): the emulator caches a cut answer's closing
        # tokens too, which a real engine never computed and the gateway rightly does not predict.
        agent = Agent(gw, max_tokens=72)  # 8 reasoning + 64 content (max_tokens counts reasoning)
        agent.messages[1]["content"] += "\n" + "def helper(x):\n    return x + 1\n" * 4000  # ~130 KB
        assert agent.turn()[1]["verdict"] == "cold"
        for _ in range(2):
            _, cache = agent.turn()
            assert (cache["verdict"] == "hit"
                    and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]), cache
        spools = list(set(Path("/dev/shm").glob(f"gateway-analysis-{gw.proc.pid}-*")) - before)
        # No job's file is left; the bodies went through the ring (conversations/handoff.py).
        assert len(spools) == 1 and [p.name for p in spools[0].iterdir()] == ["bodies"], spools
    assert not spools[0].exists()  # removed when the gateway stopped


def test_a_new_session_is_predicted_the_prefix_another_session_left_on_its_replica(agent_emu):
    """The engine's cache is one prefix tree per replica over every prompt it served: a new session
    whose system prompt and tools equal another's is predicted the shared blocks on its first turn."""
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        first = Agent(gw)
        first.messages[0]["content"] += " " + "Follow the repository's conventions. " * 80  # a long shared head
        first.cold_then_hits(1)
        second = Agent(gw)
        second.messages[0]["content"] = first.messages[0]["content"]
        second.messages[1]["content"] = "Another task entirely: write the release notes."
        _, cache = second.turn()
        assert second.cid != first.cid
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 200, cache
        assert cache["verdict"] == "hit" and cache["cause"] == "shared_prefix", cache
        _, cache = second.turn()  # its own history from then on
        assert cache["verdict"] == "hit" and cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]


def test_sessions_sent_together_are_not_credited_each_others_head(agent_emu):
    """Sessions that start together each prefill their shared head: neither is predicted the other's
    blocks, whichever is analysed first; a session sent once they answered is."""
    agent_emu.configure(prefill_tps=1500)  # the head's prefill takes a while: both are in it together
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        head = Agent(gw).messages[0]["content"] + " " + "Follow the repository's conventions. " * 80
        agents = [Agent(gw) for _ in range(3)]
        for k, agent in enumerate(agents):
            agent.messages[0]["content"] = head
            agent.messages[1]["content"] = f"Task {k}: write the release notes for part {k}."
        with ThreadPoolExecutor(2) as pool:
            together = [cache for _, cache in pool.map(lambda a: a.turn(), agents[:2])]
        for cache in together:
            assert cache["reported_cached_tokens"] == 0, cache  # the engine had nothing of it yet
            assert cache["predicted_cached_tokens"] == 0 and cache["verdict"] == "cold", cache
        _, cache = agents[2].turn()
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 200, cache
        assert cache["verdict"] == "hit" and cache["cause"] == "shared_prefix", cache


def test_a_retried_turn_with_an_edited_answer_stays_in_its_conversation(agent_emu):
    """A client that resends its turn with the relayed answer edited (Qwen Code dropping a buffered tool
    call) is found through an earlier answer it sent back: one conversation, the edit named, the
    prediction still exact."""
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        agent = Agent(gw)
        agent.cold_then_hits(2)
        last = max(i for i, m in enumerate(agent.messages) if m["role"] == "assistant")
        agent.messages[last]["content"] = (agent.messages[last].get("content") or "") + " (edited by the client)"
        cid = agent.cid
        headers, cache = agent.turn()
        assert agent.cid == cid and headers["x-gateway-conversation"].endswith("via=lineage_rejoined"), headers
        assert cache["verdict"] == "drift" and cache["cause"] == "client_retried_turn", cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"], cache
        _, cache = agent.turn()  # and it goes on from there
        assert agent.cid == cid and cache["verdict"] == "hit", cache


def test_reasoning_only_answers_do_not_join_two_sessions(agent_emu):
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        a, b = Agent(gw, tools=False), Agent(gw, tools=False)
        b.messages[1]["content"] += " Use the second approach."
        for agent, thought in ((a, "think about a"), (b, "think about b")):
            agent.turn()
            agent.messages[-2] = {"role": "assistant", "content": "", "reasoning_content": thought}
        assert lineage_digest(a.messages[-2]) != lineage_digest(b.messages[-2])
        # Their next turns, each sending back its own reasoning-only answer, land in two conversations.
        a.turn(wait=False)
        b.turn(wait=False)
        assert a.cid != b.cid


def lineage_digest(message: dict) -> int:
    from gateway.conversations.identity import message_digest

    return message_digest(message, "vllm")
