"""Hot path: repair the request's drifted copies of what the gateway relayed, before routing.

Runs after the conversation policy (it needs the conversation's identity: no heal without state at
hand) and before routing and forwarding, so the bytes sent upstream, and analysed after the response,
are the repaired ones. Per request:

1. the assistant messages are serialised together (orjson, C speed) and compared with the same
   serialisation of this conversation's previous request: every leading message whose bytes did not
   change keeps the repairs worked out for it then (a common prefix of two byte strings, memcmp);
2. only the messages after that point (usually the one just relayed) are looked up among the relayed
   messages (memory first, then one store multi-get) and planned by each kind;
3. the repairs of the lane's kinds are written into the messages in place.

Measured on the 1,600-message corpus body (784 assistant messages, every one repaired; bench/heal.py):
see the README's figures. A lane without `heal` costs one attribute read.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..exchange import Exchange, Healed
from ..runtime import LaneRuntime
from .arguments import Arguments
from .base import POP, MessageKind, Relayed, Updates, heal_digest
from .book import RelayedBook
from .content import Content
from .reasoning import Reasoning, keeps_reasoning
from .reasoning_field import ReasoningField
from .tool_result_order import ToolResultOrder, id_less_groups

log = logging.getLogger("gateway.heal")

OPT_OUT_HEADER = "x-gateway-heal"  # "off": this request goes as sent
HEALED_HEADER = "X-Gateway-Healed"
MESSAGE_KINDS: tuple[MessageKind, ...] = (Arguments(), Content(), Reasoning(), ReasoningField())
MISSING = "missing"  # no relayed message known for it (yet): looked up again while it is the newest

Fixes = tuple[tuple[str, Updates], ...]


@dataclass
class Memory:
    """What the previous request of a conversation looked like to the heal step."""

    blob: bytes  # its assistant messages as the client sent them, serialised together
    ends: list[int]  # end offset of each message in `blob`
    fixes: list[Any]  # per assistant message: Fixes, None (nothing to repair) or MISSING
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # tool_result_order's forwarded orders

    def size(self) -> int:
        return len(self.blob) + 16 * len(self.ends) + 64


class HealPolicy:
    name = "heal"

    def __init__(self, book: RelayedBook, max_bytes: int = 64 << 20) -> None:
        self.book = book
        self.max_bytes = max_bytes
        self._memory: OrderedDict[str, Memory] = OrderedDict()
        self._bytes = 0
        self.tool_order = ToolResultOrder()

    async def apply(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None:
        kinds = lane.config.heal
        if not kinds:
            return
        found = ex.conversation
        messages = body.get("messages")
        if found is None or not isinstance(messages, list):
            return
        headers = ex.request_headers or {}
        opted_out = str(headers.get(OPT_OUT_HEADER, "")).strip().lower() in ("off", "0", "false", "no")
        # A new conversation (no state at hand) or an opt-out goes as sent; what it forwarded is
        # still remembered, as the order to keep next time.
        repair = not (found.is_new or opted_out)
        try:
            await self._heal(ex, lane, body, messages, found.state.id, kinds, repair)
        except Exception:  # a repair that fails must never cost the request: it goes as sent
            log.exception("healing %s failed; forwarded as sent", ex.request_id)
            return
        if ex.healed:
            ex.response_headers[HEALED_HEADER] = header_value(ex.healed)

    async def _heal(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any], messages: list[Any], cid: str,
                    kinds: list[str], repair: bool) -> None:
        assistants = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
        mine = [messages[i] for i in assistants]
        blob = orjson.dumps(mine)
        mem = self._memory.pop(cid, None)
        if mem is not None:
            self._bytes -= mem.size()
        k = _unchanged(mem, blob)
        fixes: list[Any] = mem.fixes[:k] if mem is not None else []
        ends: list[int] = mem.ends[:k] if mem is not None else []
        if k and fixes[-1] == MISSING:  # the newest of last time may have been written since
            k -= 1
            fixes.pop()
            ends.pop()
        await self._plan(ex.tenant, mine, k, fixes, ends)
        enabled = set(kinds) if repair else set()
        if "reasoning" in enabled and not keeps_reasoning(lane.config.render.template, ex.thinking_applied,
                                                          lane.config.render.drop_thinking, body):
            enabled.discard("reasoning")  # the template drops it: nothing the model reads to repair
        for j, fx in enumerate(fixes):
            if not fx or fx == MISSING:
                continue
            msg = mine[j]
            for kind, updates in fx:
                if kind not in enabled:
                    continue
                for name, value in updates.items():
                    if value is POP:
                        msg.pop(name, None)
                    else:
                        msg[name] = value
                ex.healed.append(Healed(kind, assistants[j]))
        groups = mem.groups if mem is not None else {}
        if "tool_result_order" in kinds:
            for group in id_less_groups(messages, assistants):
                if self.tool_order.heal(messages, group, groups, repair):
                    ex.healed.append(Healed("tool_result_order", group[1]))
            ex.healed.sort(key=lambda h: h.index)
        if ends and ends[-1] + 1 == len(blob):
            self._remember(cid, Memory(blob, ends, fixes, groups))

    async def _plan(self, tenant: str, mine: list[dict[str, Any]], k: int, fixes: list[Any],
                    ends: list[int]) -> None:
        """Fixes for the assistant messages from `k` on (their bytes are new to this conversation)."""
        end = ends[-1] if ends else 0
        digests = []
        for j in range(k, len(mine)):
            end += len(orjson.dumps(mine[j])) + 1  # "[" or "," before each
            ends.append(end)
            digests.append(heal_digest(mine[j]))
        known = await self.book.lookup(tenant, list(set(digests))) if digests else {}
        for j, d in zip(range(k, len(mine)), digests):
            rel = known.get(d)
            fixes.append(MISSING if rel is None else plan(mine[j], rel))

    def _remember(self, cid: str, mem: Memory) -> None:
        self._memory[cid] = mem
        self._bytes += mem.size()
        while self._bytes > self.max_bytes and self._memory:
            _, old = self._memory.popitem(last=False)
            self._bytes -= old.size()


def plan(msg: dict[str, Any], relayed: Relayed) -> Fixes | None:
    """Every kind's repair of `msg` (whatever the lane enables: the answer depends on the bytes only)."""
    out = tuple((kind.name, u) for kind in MESSAGE_KINDS if (u := kind.plan(msg, relayed)) is not None)
    return out or None


def _unchanged(mem: Memory | None, blob: bytes) -> int:
    """How many leading assistant messages are byte for byte those of the previous request."""
    if mem is None or not mem.ends:
        return 0
    old = mem.blob
    n = min(len(old), len(blob))
    if old[: n - 1] == blob[: n - 1]:  # the usual case: the client appended (slices compare in C)
        lcp = n - 1
    else:
        lo, hi = 0, n - 1
        a, b = memoryview(old), memoryview(blob)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        lcp = lo
    # Message j is unchanged when its whole serialisation (a self-delimiting JSON object) is common.
    return bisect_right(mem.ends, lcp)


def header_value(healed: list[Healed], limit: int = 400) -> str:
    """`arguments@5,reasoning@7`: fixed kind names and message indices only (header-safe by
    construction); past `limit` characters the rest is counted, `+N`."""
    parts: list[str] = []
    size = 0
    for n, h in enumerate(healed):
        item = f"{h.kind}@{h.index}"
        if size + len(item) + 1 > limit:
            parts.append(f"+{len(healed) - n}")
            break
        parts.append(item)
        size += len(item) + 1
    return ",".join(parts)
