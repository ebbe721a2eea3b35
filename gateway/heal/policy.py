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
from collections import OrderedDict, deque
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

    n: int  # how many messages it had
    blob: bytes  # its assistant messages as the client sent them, serialised together
    ends: list[int]  # end offset of each message in `blob`
    fixes: list[Any]  # per assistant message: Fixes, None (nothing to repair) or MISSING
    positions: list[int]  # each assistant message's index in the request
    multi: list[int]  # ordinals of the assistant messages with two calls or more
    enabled: frozenset[str] = frozenset()
    ops: list[Op] = field(default_factory=list)  # the repairs applied for `enabled`, by ordinal
    at: list[int] = field(default_factory=list)  # per op: the repaired message's index
    put: list[dict[str, Any]] = field(default_factory=list)  # per op: the repaired message (never mutated)
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # their message indices, by kind
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # tool_result_order's forwarded orders

    def size(self) -> int:
        # The repaired messages share their strings with the book and the client's messages; their
        # dicts and call lists are counted at 400 bytes each.
        return len(self.blob) + 24 * len(self.ends) + 400 * len(self.put) + 64


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
        mem = self._memory.pop(cid, None)
        if mem is not None:
            self._bytes -= mem.size()
        # Where the assistant messages are: where they were last time, plus any in the messages added
        # since (walking 1,600 messages for their role cost 0.06 ms); the bytes compared below confirm it.
        positions = _guess(messages, mem)
        guessed = positions is not None
        if positions is None:
            positions = _walk(messages)
            if positions is None:  # a message that is not an object: validation lets the engine say so
                return
        mine = list(map(messages.__getitem__, positions))
        # One C pass over the assistant messages as the client sent them (0.11-0.13 ms for the corpus
        # body's 784): byte-equal to last time is the only proof that last time's repairs still fit.
        # Python's == would cost the same and call 1, 1.0 and true equal.
        blob = orjson.dumps(mine)
        k = _unchanged(mem, blob)
        if guessed and mem is not None and k < len(mem.positions):
            walked = _walk(messages)  # an earlier message changed: the guess may be wrong too
            if walked is None:
                return
            if walked != positions:
                positions, mine = walked, list(map(messages.__getitem__, walked))
                blob = orjson.dumps(mine)
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
        at: list[int] = []  # the index of each repaired message
        put: list[dict[str, Any]] = []  # what goes in its place
        if reuse and mem is not None:
            cut = _ops_before(mem.ops, reuse)
            ops, at, put = mem.ops[:cut], mem.at[:cut], mem.put[:cut]
            limit = positions[reuse] if reuse < len(positions) else len(messages)
            by_kind = {kind: v[:bisect_left(v, limit)] for kind, v in mem.by_kind.items()}
        for j in range(reuse, len(fixes)):
            op = _op(j, fixes[j], enabled)
            if op is not None:
                ops.append(op)
                at.append(positions[j])
                put.append(_repaired(mine[j], op))
                for kind in op[3]:
                    by_kind.setdefault(kind, []).append(positions[j])
        # Copy on write: the repaired message takes the client's message's place; the client's own dict
        # is never changed. A message unchanged since last time gets last time's repaired dict (equal
        # bytes in, equal bytes out), so the repairs cost a list assignment each (0.03 ms for 784),
        # not a dict update and a new call list each.
        if at:
            deque(map(messages.__setitem__, at, put), maxlen=0)
            # The client's replaced messages are freed once the request is on its way, not here:
            # freeing 784 of them cost 0.1-0.15 ms of the step.
            asyncio.get_running_loop().call_soon(mine.clear)
        memo_by_kind = {kind: v for kind, v in by_kind.items() if v}
        groups = mem.groups if mem is not None else {}
        if watch_order and multi:
            repaired = [group[1] for group in id_less_groups(messages, [positions[j] for j in multi])
                        if self.tool_order.heal(messages, group, groups, "tool_result_order" in enabled)]
            if repaired:
                by_kind = {**by_kind, "tool_result_order": repaired}
        ex.healed = [Healed(kind, indices) for kind, indices in by_kind.items() if indices]  # never mutated
        if ends and ends[-1] + 1 == len(blob):
            self._remember(cid, Memory(len(messages), blob, ends, fixes, positions, multi, enabled, ops, at, put,
                                       memo_by_kind, groups))

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


def _guess(messages: list[Any], mem: Memory | None) -> list[int] | None:
    """The assistant messages' indices if nothing before the previous request's end moved: its
    positions, plus those among the messages added since. None when that cannot be so."""
    if mem is None or len(messages) < mem.n or (mem.positions and mem.positions[-1] >= len(messages)):
        return None
    added = _walk(messages, mem.n)
    return None if added is None else mem.positions + added


def _walk(messages: list[Any], start: int = 0) -> list[int] | None:
    """The indices of the assistant messages from `start` on; None when one is not an object."""
    try:
        return [i for i, m in enumerate(islice(messages, start, None), start) if m.get("role") == "assistant"]
    except AttributeError:
        return None


def _repaired(msg: dict[str, Any], op: Op) -> dict[str, Any]:
    _, sets, pops, _ = op
    out = {**msg, **sets}
    for name in pops:
        out.pop(name, None)
    return out


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
