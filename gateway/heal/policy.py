"""Hot path: repair the request's drifted copies of what the gateway relayed, before routing.

Runs after the conversation policy (it needs the conversation's identity: no repair without its state
at hand) and before routing and forwarding, so the bytes sent upstream, and analysed after the
response, are the repaired ones. Per request:

1. the assistant messages are serialised together (orjson, C speed) and compared with the same
   serialisation of this conversation's previous request: every leading message whose bytes did not
   change keeps the repairs worked out for it then (the common prefix of two byte strings, memcmp);
2. only the messages after that point (usually the one just relayed) are looked up among the relayed
   messages (memory first, then one store multi-get) and planned by each kind;
3. the repairs of the lane's kinds are written into the messages in place.

Measured with bench/heal.py on the 1,600-message corpus body (784 assistant messages, all repaired
every turn): see the README. A lane without `heal` costs one attribute read.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import islice
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
Op = tuple[int, dict[str, Any], tuple[str, ...], tuple[str, ...]]  # (ordinal, sets, pops, kinds)


@dataclass
class Memory:
    """What the previous request of a conversation looked like to the heal step."""

    blob: bytes  # its assistant messages as the client sent them, serialised together
    ends: list[int]  # end offset of each message in `blob`
    fixes: list[Any]  # per assistant message: Fixes, None (nothing to repair) or MISSING
    positions: list[int]  # each assistant message's index in the request
    multi: list[int]  # ordinals of the assistant messages with two calls or more
    enabled: frozenset[str] = frozenset()
    ops: list[Op] = field(default_factory=list)  # the repairs applied for `enabled`, by ordinal
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # their message indices, by kind
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # tool_result_order's forwarded orders

    def size(self) -> int:
        return len(self.blob) + 24 * len(self.ends) + 64


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
        enabled = set(kinds)
        if found.is_new or opted_out:
            # No state at hand, or the client said no: the request goes as sent. What it forwarded is
            # still remembered (the tool-result orders to keep next time).
            enabled = set()
        elif "reasoning" in enabled and not keeps_reasoning(lane.config.render.template, ex.thinking_applied,
                                                            lane.config.render.drop_thinking, body):
            enabled.discard("reasoning")  # the template drops it: nothing the model reads to repair
        try:
            await self._heal(ex, messages, found.state.id, frozenset(enabled), "tool_result_order" in kinds)
        except Exception:  # a repair that fails must never cost the request: it goes as sent
            log.exception("healing %s failed; forwarded as sent", ex.request_id)
            return
        if ex.healed:
            ex.response_headers[HEALED_HEADER] = header_value(ex.healed)

    async def _heal(self, ex: Exchange, messages: list[Any], cid: str, enabled: frozenset[str],
                    watch_order: bool) -> None:
        try:
            positions = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        except AttributeError:  # a message that is not an object: validation lets the engine say so
            return
        mine = [messages[i] for i in positions]
        blob = orjson.dumps(mine)
        mem = self._memory.pop(cid, None)
        if mem is not None:
            self._bytes -= mem.size()
        k = _unchanged(mem, blob)
        if k and mem is not None and mem.fixes[k - 1] == MISSING:  # may have been written since
            k -= 1
        fixes: list[Any] = mem.fixes[:k] if mem is not None else []
        ends: list[int] = mem.ends[:k] if mem is not None else []
        multi: list[int] = mem.multi[:bisect_left(mem.multi, k)] if mem is not None else []
        await self._plan(ex.tenant, mine, k, fixes, ends, multi)
        # Repairs worked out last time for the unchanged messages stand, when they sit where they did.
        reuse = k if mem is not None and mem.enabled == enabled and mem.positions[:k] == positions[:k] else 0
        by_kind: dict[str, list[int]] = {}
        ops: list[Op] = []
        if reuse and mem is not None:
            ops = mem.ops[:_ops_before(mem.ops, reuse)]
            cut = positions[reuse] if reuse < len(positions) else len(messages)
            by_kind = {kind: v[:bisect_left(v, cut)] for kind, v in mem.by_kind.items()}
        for j in range(reuse, len(fixes)):
            op = _op(j, fixes[j], enabled)
            if op is not None:
                ops.append(op)
                for kind in op[3]:
                    by_kind.setdefault(kind, []).append(positions[j])
        # The client's replaced calls are freed once the request is on its way, not before: freeing
        # 784 call lists here cost 0.1-0.15 ms of the step (bench/heal.py).
        released = [mine[j].get("tool_calls") for j, sets, _, _ in ops if "tool_calls" in sets]
        for j, sets, pops, _ in ops:  # the repairs themselves: a dict update per message
            msg = mine[j]
            msg.update(sets)
            for name in pops:
                msg.pop(name, None)
        if released:
            asyncio.get_running_loop().call_soon(released.clear)
        memo_by_kind = {kind: v for kind, v in by_kind.items() if v}
        groups = mem.groups if mem is not None else {}
        if watch_order and multi:
            repaired = [group[1] for group in id_less_groups(messages, [positions[j] for j in multi])
                        if self.tool_order.heal(messages, group, groups, "tool_result_order" in enabled)]
            if repaired:
                by_kind = {**by_kind, "tool_result_order": repaired}
        ex.healed = [Healed(kind, indices) for kind, indices in by_kind.items() if indices]  # never mutated
        if ends and ends[-1] + 1 == len(blob):
            self._remember(cid, Memory(blob, ends, fixes, positions, multi, enabled, ops, memo_by_kind, groups))

    async def _plan(self, tenant: str, mine: list[dict[str, Any]], k: int, fixes: list[Any],
                    ends: list[int], multi: list[int]) -> None:
        """Fixes for the assistant messages from `k` on (their bytes are new to this conversation)."""
        end = ends[-1] if ends else 0
        digests = []
        for j in range(k, len(mine)):
            end += len(orjson.dumps(mine[j])) + 1  # "[" or "," before each
            ends.append(end)
            digests.append(heal_digest(mine[j]))
            calls = mine[j].get("tool_calls")
            if isinstance(calls, list) and len(calls) >= 2:
                multi.append(j)
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


def _op(j: int, fx: Any, enabled: frozenset[str]) -> Op | None:
    if not fx or fx == MISSING:
        return None
    sets: dict[str, Any] = {}
    pops: list[str] = []
    kinds: list[str] = []
    for kind, updates in fx:
        if kind not in enabled:
            continue
        kinds.append(kind)
        for name, value in updates.items():
            if value is POP:
                pops.append(name)
            else:
                sets[name] = value
    return (j, sets, tuple(pops), tuple(kinds)) if kinds else None


def _ops_before(ops: list[Op], k: int) -> int:
    lo, hi = 0, len(ops)
    while lo < hi:
        mid = (lo + hi) // 2
        if ops[mid][0] < k:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _unchanged(mem: Memory | None, blob: bytes) -> int:
    """How many leading assistant messages are byte for byte those of the previous request."""
    if mem is None or not mem.ends:
        return 0
    old = mem.blob
    n = min(len(old), len(blob))
    if blob.startswith(memoryview(old)[: n - 1]):  # the usual case: the client appended (memcmp, no copy)
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
    """`arguments@5,reasoning@7`, by message: fixed kind names and message indices only (header-safe by
    construction); past `limit` characters the rest is counted, `+N`."""
    total = sum(len(h.indices) for h in healed)
    merged = heapq.merge(*[[(i, h.kind) for i in h.indices[:64]] for h in healed])
    parts: list[str] = []
    size = 0
    for index, kind in islice(merged, 64):
        item = f"{kind}@{index}"
        if size + len(item) + 1 > limit:
            break
        parts.append(item)
        size += len(item) + 1
    if len(parts) < total:
        parts.append(f"+{total - len(parts)}")
    return ",".join(parts)
