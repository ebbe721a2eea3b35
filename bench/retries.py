"""A session whose client retries turns (the relayed answer edited or dropped, as Qwen Code does when it
discards a buffered tool call): how many conversations it forms and how many turns are predicted right.

    .venv/bin/python bench/retries.py [--turns 20] [--retries 5]

Every retry edits the answer the gateway relayed last and sends the turn again. Printed: conversations
formed, turns whose predicted cached tokens equal the engine's, and the first turn's prediction of a
second session that shares the first one's system prompt and tools.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.conversations import Agent, wait_analysed  # noqa: E402
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator  # noqa: E402
from tests.support.gateway_proc import run_gateway  # noqa: E402
from tests.support.routes import agent_routes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--retries", type=int, default=5)
    args = ap.parse_args()
    every = max(2, args.turns // max(1, args.retries))
    with run_emulator(**AGENT_EMULATOR) as emu, run_gateway(agent_routes(emu.url)) as gw:
        agent = Agent(gw)
        agent.messages[0]["content"] += " " + "Follow the repository's conventions. " * 200
        conversations, right, retried = set(), 0, 0
        misses: list[str] = []
        for t in range(args.turns):
            if t and t % every == 0 and retried < args.retries:
                last = max(i for i, m in enumerate(agent.messages) if m["role"] == "assistant")
                agent.messages[last]["content"] = (agent.messages[last].get("content") or "") + " (retried)"
                retried += 1
            headers, _ = agent.turn(wait=False)
            turn = int(headers["x-gateway-conversation"].split("turn=")[1].split(";")[0])
            cache = wait_analysed(gw, agent.cid, turn)["last_cache"]
            conversations.add(agent.cid)
            ok = cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]
            right += ok
            if not ok:
                misses.append(f"turn {t + 1}: predicted {cache['predicted_cached_tokens']}, reported "
                              f"{cache['reported_cached_tokens']} ({cache['verdict']}, {cache.get('cause')})")
        other = Agent(gw)
        other.messages[0]["content"] = agent.messages[0]["content"]
        other.messages[1]["content"] = "A different task: write the release notes."
        headers, _ = other.turn(wait=False)
        first = wait_analysed(gw, other.cid, 1)["last_cache"]
    print(f"{args.turns} turns, {retried} retried: {len(conversations)} conversation(s), "
          f"{right}/{args.turns} turns predicted right")
    for miss in misses:
        print("  " + miss)
    print(f"a second session sharing the system prompt and tools: turn 1 predicted {first['predicted_cached_tokens']}, "
          f"engine reported {first['reported_cached_tokens']} ({first['verdict']}, {first.get('cause')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
