"""Hot path: repair the request's drifted copies of what the gateway relayed, before routing.

Runs after the conversation policy (it needs the conversation's identity: no repair without its state
at hand) and before routing and forwarding, so the bytes sent upstream, and analysed after the
response, are the repaired ones. Per request, with what this process remembers of the conversation's
previous request:

1. the assistant messages are where they were, plus those among the messages added since (no walk of
   the whole list);
2. the messages read are compared with last time's: the very objects when the pipeline's history memo
   hands the unchanged history over, else serialised together (orjson) and compared with last time's
   bytes (a memcmp): every message repaired last time (its repair stands only if it did not change),
   and those that were new last time. Assistant messages that needed no repair and are older than that
   are not read at all, except that when a user message arrives the previous user turn's are planned
   again (clients drop its reasoning then);
3. only what changed, and the new messages, are looked up among the relayed messages (memory first,
   then one store multi-get) and planned by each kind;
4. the body gets a new list with each repaired message's repaired copy in its place (copy on write:
   the client's list and messages are shared with the next turn by the history memo), the same dict
   as last time when the client's message did not change.

bench/heal.py prints what it costs on the 1,600-message corpus body (784 assistant messages).
A lane without `heal` costs one attribute read.
"""

from __future__ import annotations

import asyncio
import heapq
import operator
import logging
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import orjson

from ..core.exchange import Exchange, Healed
from ..core.runtime import LaneRuntime
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
# At most this many assistant messages of the previous user turn are planned again when the next turn
# starts (a client drops their reasoning then).
TAIL = 256
MISSING = "missing"  # no relayed message known for it (yet): looked up again while it is the newest

Fixes = tuple[tuple[str, Updates], ...]
Op = tuple[int, dict[str, Any], tuple[str, ...], tuple[str, ...]]  # (ordinal, sets, pops, kinds)


@dataclass
class Memory:
    """What the previous request of a conversation looked like to the heal step."""

    n: int  # how many messages it had
    positions: list[int]  # each assistant message's index (by ordinal: 0 is the first assistant message)
    last_user: int  # the index of its last user message (-1: none)
    fixes: list[Any]  # per ordinal: Fixes, None (nothing to repair) or MISSING
    checked: list[int]  # the ordinals compared byte for byte next time (ascending): the repaired, the new
    checked_at: list[int]  # their indices
    objs: list[Any]  # those messages as the client sent them (never changed in place: compared by identity)
    blob: bytes  # and serialised together
    ends: list[int]  # end offset of each in `blob`
    new_from: int  # the first ordinal new in that request
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
        # The client's messages: their bytes, and ~3x as many as Python objects (shared with the history
        # memo when it holds them).
        return 4 * len(self.blob) + 24 * (len(self.positions) + 2 * len(self.checked)) \
            + 400 * len(self.put) + 64


class HealPolicy:
    name = "heal"
    per_lane = True

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
            await self._heal(ex, body, messages, found.state.id, frozenset(enabled), "tool_result_order" in kinds)
        except Exception:  # a repair that fails must never cost the request: it goes as sent
            log.exception("healing %s failed; forwarded as sent", ex.request_id)
            return
        if ex.healed:
            ex.response_headers[HEALED_HEADER] = header_value(ex.healed)

    async def _heal(self, ex: Exchange, body: dict[str, Any], messages: list[Any], cid: str, enabled: frozenset[str],
                    watch_order: bool) -> None:
        mem = self._memory.pop(cid, None)
        if mem is not None:
            self._bytes -= mem.size()
        # Where the messages are: where they were last time, plus those among the messages added since
        # (not a walk over every message for its role); the bytes compared below confirm it.
        old = len(mem.positions) if mem is not None else 0  # (before the guess extends them)
        roles = _guess(messages, mem)
        guessed = roles is not None
        if roles is None:
            mem, old, roles = None, 0, _walk(messages)
            if roles is None:  # a message that is not an object: validation lets the engine say so
                return
        positions, last_user = roles
        # The messages read: last time's checked ones (every repaired message, and those new last time),
        # byte for byte, then the new ones. One C pass (orjson) over them as the client sent them;
        # byte-equal to last time is the only proof that last time's repairs still fit (Python's == would
        # call 1, 1.0 and true equal). The others, which needed no repair, are not read at all: reading
        # every assistant message of a long history (fresh objects, cache misses) is what "nothing to
        # heal" must not cost. Except when a user message arrives: a client
        # drops the reasoning of the previous user turn's messages then, so they are planned again.
        # A change elsewhere is forwarded as sent: a repair missed, never a wrong one, and the forwarded
        # bytes stay what they were (the cache's prefix).
        if mem is None:
            ords, at, cap = list(range(len(positions))), positions[:], 0  # (positions grows in place next time)
        else:
            ords, at, cap = mem.checked, mem.checked_at, len(mem.checked)
            if last_user != mem.last_user and mem.last_user >= 0:  # a new user turn
                turn = range(max(bisect_right(positions, mem.last_user, 0, old), old - TAIL), old)
                ords = sorted(set(ords).union(turn))
                if len(ords) > cap:
                    at = [positions[j] for j in ords]
                    cap = next((x for x, (a, b) in enumerate(zip(ords, mem.checked)) if a != b), cap)
            ords = ords + list(range(old, len(positions)))
            at = at + positions[old:]
        sent = list(map(messages.__getitem__, at))
        same = _unchanged(mem, sent)
        i = min(same, cap)
        if guessed and mem is not None and same < cap:
            walked = _walk(messages)  # a checked message changed: the guess may be wrong too
            if walked is None:
                return
            if walked[0] != positions:  # messages moved: nothing known holds
                mem, old, (positions, last_user) = None, 0, walked
                ords, at = list(range(len(positions))), positions[:]  # (positions grows in place next time)
                sent = list(map(messages.__getitem__, at))
                i = 0
        fixes: list[Any] = mem.fixes if mem is not None else []
        if mem is not None and i == len(mem.checked) and mem.checked and mem.checked[-1] == old - 1 \
                and fixes[old - 1] == MISSING:
            i -= 1  # the newest known message's relayed copy may have been written since
        ends: list[int] = mem.ends[:i] if mem is not None else []
        replanned = ords[i:]
        multi: list[int] = mem.multi if mem is not None else []
        if replanned and multi and multi[-1] >= replanned[0]:
            again = set(replanned)
            multi = [j for j in multi if j not in again]
        pieces = await self._plan(ex.tenant, sent, i, ords, fixes, ends, multi)
        # Their bytes together, for next time: the unchanged ones' as they were, the others' just written.
        head = [memoryview(mem.blob)[:mem.ends[i - 1]], b","] if i and mem is not None else [b"["]
        blob = b"".join((*head, b",".join(pieces), b"]")) if pieces else b"".join((*head[:1], b"]"))
        # Repairs worked out last time for the unchanged messages stand.
        first = replanned[0] if replanned else len(positions)
        by_kind: dict[str, list[int]] = {}
        ops: list[Op] = []
        rat: list[int] = []  # the index of each repaired message
        put: list[dict[str, Any]] = []  # what goes in its place
        start = 0
        if mem is not None and mem.enabled == enabled:
            cut = _ops_before(mem.ops, first)
            ops, rat, put = mem.ops, mem.at, mem.put  # the memory's own lists: no copy of 784
            if cut < len(ops):
                del ops[cut:], rat[cut:], put[cut:]
            limit = positions[first] if first < len(positions) else len(messages)
            by_kind = {kind: v[:bisect_left(v, limit)] for kind, v in mem.by_kind.items()}
            start = i
        for idx in range(start, len(ords)):
            j = ords[idx]
            op = _op(j, fixes[j], enabled)
            if op is not None:
                ops.append(op)
                rat.append(positions[j])
                put.append(_repaired(sent[idx], op))
                for kind in op[3]:
                    by_kind.setdefault(kind, []).append(positions[j])
        # Copy on write, list and messages: the body gets a new list with the repaired copies in their
        # places; the client's list and dicts are never changed (the pipeline's history memo shares them
        # with the next turn, and forwards the client's own bytes while the list is the one it parsed).
        # A message unchanged since last time gets last time's repaired dict (equal bytes in, equal
        # bytes out), so the repairs cost a list assignment each, not a dict update
        # and a new call list each.
        out = list(messages) if rat or (watch_order and multi) else messages
        if rat:
            deque(map(out.__setitem__, rat, put), maxlen=0)
        memo_by_kind = {kind: v for kind, v in by_kind.items() if v}
        groups = mem.groups if mem is not None else {}
        if watch_order and multi:
            repaired = [group[1] for group in id_less_groups(out, [positions[j] for j in multi])
                        if self.tool_order.heal(out, group, groups, "tool_result_order" in enabled)]
            if repaired:
                by_kind = {**by_kind, "tool_result_order": repaired}
        if rat or by_kind.get("tool_result_order"):
            body["messages"] = out
        ex.healed = [Healed(kind, indices) for kind, indices in by_kind.items() if indices]  # never mutated
        if len(ends) != len(sent) or (ends[-1] if ends else 1) + 1 != len(blob):
            return
        # Checked next time: every repaired message (its repair must still fit) and the new ones (a
        # client may drop the reasoning of all but its newest assistant message).
        new_from = (old if len(positions) > old else mem.new_from) if mem is not None \
            else bisect_right(positions, last_user)  # (a retry adds none: last time's stay the new ones)
        lo = min(i, bisect_left(ords, mem.new_from)) if mem is not None else 0
        drop = [idx for idx in range(lo, bisect_left(ords, new_from)) if type(fixes[ords[idx]]) is not tuple]
        if drop:
            ords, at, sent, blob, ends = _without(drop, ords, at, sent, blob, ends)
        if mem is not None and len(mem.objs) > 64:
            # Last time's messages are let go once the request is on its way, not here: freeing hundreds
            # of them (when the history memo does not hold them) would delay the request.
            asyncio.get_running_loop().call_soon(mem.objs.clear)
        self._remember(cid, Memory(len(messages), positions, last_user, fixes, ords, at, sent, blob, ends, new_from,
                                   multi, enabled, ops, rat, put, memo_by_kind, groups))

    async def _plan(self, tenant: str, sent: list[dict[str, Any]], i: int, ords: list[int], fixes: list[Any],
                    ends: list[int], multi: list[int]) -> list[bytes]:
        """Fixes for the compared messages from element `i` on (changed, or new to this conversation);
        returns their bytes."""
        end = ends[-1] if ends else 0
        digests = []
        pieces = []
        for idx in range(i, len(sent)):
            msg = sent[idx]
            piece = orjson.dumps(msg)
            pieces.append(piece)
            end += len(piece) + 1  # "[" or "," before each
            ends.append(end)
            digests.append(heal_digest(msg))
            calls = msg.get("tool_calls")
            if isinstance(calls, list) and len(calls) >= 2:
                insort(multi, ords[idx])
        known = await self.book.lookup(tenant, list(set(digests))) if digests else {}
        for idx, d in zip(range(i, len(sent)), digests):
            rel = known.get(d)
            fx = MISSING if rel is None else plan(sent[idx], rel)
            j = ords[idx]
            if j < len(fixes):
                fixes[j] = fx
            else:
                fixes.append(fx)
        return pieces

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


def _guess(messages: list[Any], mem: Memory | None) -> tuple[list[int], int] | None:
    """(assistant indices, last user index) if nothing before the previous request's end moved: its,
    and those among the messages added since. None when that cannot be so."""
    if mem is None or len(messages) < mem.n or (mem.positions and mem.positions[-1] >= len(messages)):
        return None
    added = _walk(messages, mem.n)
    if added is None:
        return None
    mem.positions.extend(added[0])  # (the memory is this request's now: no copy of 784 indices)
    return mem.positions, max(mem.last_user, added[1])


def _walk(messages: list[Any], start: int = 0) -> tuple[list[int], int] | None:
    """(assistant indices, last user index or -1) from `start` on; None when a message is not an object."""
    assistants: list[int] = []
    last_user = -1
    try:
        for i, m in enumerate(messages[start:] if start else messages, start):  # (islice would step over the first)
            role = m.get("role")
            if role == "assistant":
                assistants.append(i)
            elif role == "user":
                last_user = i
    except AttributeError:
        return None
    return assistants, last_user


def _without(drop: list[int], ords: list[int], at: list[int], sent: list[Any], blob: bytes,
             ends: list[int]) -> tuple[list[int], list[int], list[Any], bytes, list[int]]:
    """The compared messages without the elements `drop` (no repair, no longer new)."""
    gone = set(drop)
    keep = [idx for idx in range(len(ords)) if idx not in gone]
    new_ends: list[int] = []
    pieces = []
    end = 0
    for idx in keep:
        start = ends[idx - 1] + 1 if idx else 1
        pieces.append(blob[start:ends[idx]])
        end += ends[idx] - start + 1
        new_ends.append(end)
    return ([ords[idx] for idx in keep], [at[idx] for idx in keep], [sent[idx] for idx in keep],
            b"[" + b",".join(pieces) + b"]", new_ends)


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


def _unchanged(mem: Memory | None, sent: list[Any]) -> int:
    """How many leading compared messages are last time's, unchanged: the very objects (the pipeline's
    history memo hands an unchanged history over as the objects it parsed last turn, and nothing changes
    a message in place: an identity check each), else byte for byte (one orjson pass over them,
    compared with last time's bytes by a memcmp)."""
    if mem is None or not mem.objs:
        return 0
    old = mem.objs
    if sent[0] is old[0] and all(map(operator.is_, sent, old)):  # (the memo reuses a history whole, or not)
        return len(old)
    blob, was = orjson.dumps(sent[:len(old)]), mem.blob
    n = min(len(was), len(blob))
    if blob.startswith(memoryview(was)[:n - 1]):  # the usual case (memcmp, no copy)
        lcp = n - 1
    else:
        lo, hi = 0, n - 1
        a, b = memoryview(was), memoryview(blob)
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
