"""conversation_affinity: a conversation's turns go where its KV cache lives.

Decision, per request (ex.routing.reason):

* home: the conversation has a home (the replica that served its last turn, from the shared home
  record or the conversation state, whichever is fresher) that is healthy and not overloaded.
* rehomed_unhealthy / rehomed_overload: the home's breaker is open (or it left the lane), or its
  in-flight count exceeds max_load_factor x the lane's mean + load_slack (all gateway processes
  counted). The turn goes to the least loaded other replica, which becomes the home; the record
  says the turn runs cold there (expected_cold).
* prefix: a new conversation (or one whose head drifted, so its cache is lost wherever it was)
  goes to the replica known to hold the longest prefix of its messages (prefix_index.py), if that
  covers at least prefix_min_share of it and the replica is not overloaded;
* least_loaded: otherwise, the replica home to the fewest conversations, then with the fewest
  requests in flight.

The store lookups (home record, prefix index) happen in `prepare`, one round trip before the
request is forwarded; `order` itself is plain arithmetic. What was decided is written back (home
record, prefix entries) beside the request once a replica accepted it (`served`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..core.config import Affinity
from ..core.exchange import Exchange, LoadAtMove, Room, RouteDecision
from ..render.normalize import tools_digest
from ..upstream.replicas import Replica
from . import prefix_index
from .base import healthy_first, note, served_note
from .shared import HOME_PREFIX, RoutingShared

if TYPE_CHECKING:
    from ..conversations.state import ConversationState

log = logging.getLogger("gateway.routing")

REFRESH_EVERY_TURNS = 16  # rewrite every prefix entry now and then, so long conversations' entries live on
# A prefix this long (~8K tokens) is worth following to a replica already home to more than its share
# of conversations (within the bounded-load limit); a shorter one only to a replica at or below its share.
LONG_PREFIX_CHARS = 32_000


@dataclass
class Hint:
    """What `prepare` found in the store for one request."""

    home: str | None = None  # replica URL
    home_turn: int = 0
    shared_home: str | None = None  # what the store's shared copy says (a write is needed when it differs)
    prefix: dict[str, tuple[float, int]] = field(default_factory=dict)  # replica URL -> (share, characters) held
    head: int | None = None  # prefix-index seed of this request
    drift: str | None = None  # "thinking" | "effort" | "tools": the render's head changed since the last turn
    from_kv: bool = False  # `prefix` came from the KV-event indexes (prefix_source: kv_events)


class ConversationAffinity:
    name = "conversation_affinity"

    def __init__(self, settings: Affinity | None = None, shared: RoutingShared | None = None,
                 lane: str = "") -> None:
        self.settings = settings or Affinity()
        self.shared = shared or RoutingShared()
        self.lane = lane
        self._turn = 0

    def bind(self, shared: RoutingShared, lane: str, settings: Affinity) -> None:
        self.shared, self.lane, self.settings = shared, lane, settings
        shared.board.windows[lane] = settings.load_window_s

    # -- before forwarding: one store round trip ---------------------------------------------------

    async def prepare(self, ex: Exchange, lane: Any, body: dict[str, Any]) -> None:
        if len(lane.upstream.replicas) == 1:
            ex.routing_single = True
            return  # nothing to choose: no lookups on the hot path
        found = ex.conversation
        state = found.state if found is not None else None
        body = ex.chat if ex.chat is not None else body  # a Responses request: its chat view
        messages = body.get("messages")
        hint = Hint()
        ex.routing_hint = hint
        if isinstance(messages, list) and messages:
            hint.head = prefix_index.seed(self.lane, ex.tenant, ex.thinking_applied, ex.effort_applied,
                                          body.get("tools"))
            hint.drift = _head_drift(state, ex, body, "vllm" if lane.config.engine == "vllm" else "sglang")
        wants_prefix = found is None or found.is_new or found.state.replica is None or hint.drift
        kv = self._kv()
        if kv is not None and wants_prefix and hint.head is not None:
            # prefix_source: kv_events: what each pool actually holds, from the engines' own events (in memory).
            hint.prefix = kv.prefix_hint(self.lane, messages, hint.head, [r.url for r in lane.upstream.replicas])
            hint.from_kv = True
        if self.shared.store is None:
            return
        keys: list[str] = []
        if state is not None:
            keys.append(HOME_PREFIX + state.id)
        lookup = None
        if wants_prefix and hint.head is not None and not hint.from_kv and isinstance(messages, list):
            lookup = prefix_index.Lookup(messages, hint.head, [r.url for r in lane.upstream.replicas])
            keys += lookup.keys
        if not keys:
            return
        values, shared = await self.shared.mget(keys)
        if state is not None:
            record = _home_record(values[0])
            values = values[1:]
            # Unknown (None) when only the local fallback answered: `served` then writes the home, so
            # the shared copy hears of moves made while it was away.
            hint.shared_home = record[0] if record is not None and shared else None
            # After a store outage the shared copy may be older than what this process decided
            # meanwhile (kept in the store's local fallback): the later decision wins.
            mine = _home_record(await self.shared.store.get_fallback(HOME_PREFIX + state.id))
            if mine is not None and (record is None or mine[2] > record[2]):
                record = mine
            if record is not None:
                hint.home, hint.home_turn = record[0], record[1]
        if lookup is not None:
            hint.prefix = lookup.best(values)

    # -- the decision --------------------------------------------------------------------------------

    def order(self, replicas: list[Replica], ex: Exchange) -> list[Replica]:
        live = healthy_first(replicas)
        if len(replicas) == 1 or not live:
            return live
        hint: Hint = ex.routing_hint or Hint()
        state = ex.conversation.state if ex.conversation is not None else None
        home = _freshest_home(hint, state)
        board = self.shared.board
        lane = self.lane
        factor, slack = self.settings.max_load_factor, self.settings.load_slack
        load = {r.url: board.inflight(lane, r.url, r.inflight) for r in replicas}
        mean = sum(load[r.url] for r in live) / len(live)
        bound = factor * mean + slack
        smooth_bound = None
        if self.settings.load_window_s > 0:
            smooth = {r.url: board.smoothed(lane, r.url) for r in live}
            if all(v is not None for v in smooth.values()):
                smooth_bound = factor * sum(smooth.values()) / len(live) + slack  # type: ignore[arg-type]

        def over(r: Replica) -> bool:
            """Bounded load: over the bound now, and (with a window) over it on average lately too."""
            if load[r.url] <= bound:
                return False
            return smooth_bound is None or (board.smoothed(lane, r.url) or 0.0) > smooth_bound

        def least_loaded(candidates: list[Replica]) -> Replica:
            return min(candidates, key=lambda r: (load[r.url], board.home_count(lane, r.url)))

        by_url = {r.url: r for r in live}
        moved_load: LoadAtMove | None = None
        room: Room | None = None
        placed_share: float | None = None
        if home is not None and not hint.drift:
            r = by_url.get(home)
            if r is not None and not over(r):
                chosen, reason, cold = r, "home", False
            else:
                others = [x for x in live if x.url != home] or live
                reason = "rehomed_unhealthy" if r is None else "rehomed_overload"
                chosen, room = self._rehome(others, least_loaded, state)
                cold = True
                moved_load = LoadAtMove(load.get(home), round(mean, 2), round(bound, 2))
        else:
            chosen, reason, share = self._place(live, hint, load, over, conversation=state is not None)
            if share is not None:
                placed_share = round(share, 3)
            # A conversation with turns behind it whose head drifted: its cache is lost wherever it goes.
            cold = home is not None and hint.drift is not None
        if chosen.url != home and state is not None:  # a conversation's home (not a bare completion)
            self._moved(home, chosen.url)
        self.shared.count(lane, reason)
        note(ex, RouteDecision(self.name, chosen.url, reason, cold, previous=home, drift=hint.drift or None,
                               load=moved_load, share=placed_share, room=room), replicas)
        rest = sorted((r for r in live if r is not chosen), key=lambda r: (over(r), load[r.url]))
        return [chosen, *rest]

    def _kv(self) -> Any:
        return self.shared.kv if self.settings.prefix_source == "kv_events" else None

    def _rehome(self, others: list[Replica], least_loaded,
                state: "ConversationState | None") -> tuple[Replica, Room | None]:
        """With KV events: a re-homed conversation goes where the pool has room for its prefix (least
        loaded among those), else where it has the most room; without them, the least loaded."""
        kv = self._kv()
        if kv is None or state is None:
            return least_loaded(others), None
        need = kv.tokens_of(self.lane, state.id) or (state.last.prompt_tokens if state.last is not None else 0) or 0
        room = {r.url: kv.room(self.lane, r.url) for r in others}
        known = [r for r in others if room[r.url] is not None]
        if not known:
            return least_loaded(others), None
        fits = [r for r in known if room[r.url] >= need]
        chosen = least_loaded(fits) if fits else max(known, key=lambda r: room[r.url])
        return chosen, Room(need, room[chosen.url])

    def _place(self, live: list[Replica], hint: Hint, load: dict[str, float], over,
               conversation: bool = True) -> tuple[Replica, str, float | None]:
        """Where a conversation without a usable home goes: the longest known prefix, else the least loaded."""
        board = self.shared.board
        homes = {r.url: board.home_count(self.lane, r.url) for r in live}
        fair = sum(homes.values()) / len(live) + 1e-6
        homes_bound = self.settings.max_load_factor * fair + self.settings.load_slack

        def takes(r: Replica, chars: int) -> bool:
            # Pools fill with homes: a replica already home to more than its share of conversations takes
            # a new one only for a long prefix (a short one saves less than its pool would then evict).
            return homes[r.url] <= fair or (chars >= LONG_PREFIX_CHARS and homes[r.url] <= homes_bound)

        candidates = [(share, r) for r in live if r.url in hint.prefix
                      and (share := hint.prefix[r.url][0]) >= self.settings.prefix_min_share and share > 0
                      and not over(r) and takes(r, hint.prefix[r.url][1])]
        if candidates:
            best = max(s for s, _ in candidates)
            tied = [r for s, r in candidates if s >= best - 1e-9]
            chosen = min(tied, key=lambda r: (load[r.url], homes[r.url]))
            return chosen, "prefix", best
        fine = [r for r in live if not over(r)] or live
        self._turn = (self._turn + 1) % len(fine)
        spin = {r.url: (i - self._turn) % len(fine) for i, r in enumerate(fine)}  # ties take turns
        if conversation:  # a new home: even out the pools first, then the queues
            chosen = min(fine, key=lambda r: (homes[r.url], load[r.url], spin[r.url]))
        else:  # no conversation to keep (e.g. /v1/completions): the queues alone
            chosen = min(fine, key=lambda r: (load[r.url], spin[r.url]))
        return chosen, "least_loaded", None

    def _moved(self, old: str | None, new: str) -> None:
        homes = self.shared.board.homes
        if old is not None:
            homes.add(self.lane, old, -1.0)
        homes.add(self.lane, new, 1.0)

    # -- after a replica accepted the request -------------------------------------------------------

    def served(self, replica: Replica, ex: Exchange) -> None:
        if ex.routing_single:
            return  # a single-replica lane: nothing was planned, nothing to remember
        decision = ex.routing
        if decision is not None and decision.replica != replica.url:
            # Failover: the planned replica did not answer; this one is the conversation's home now.
            planned = decision.replica
            if decision.previous == replica.url:
                decision.reason = "home"
            elif decision.previous is not None:
                decision.reason = "rehomed_unhealthy"
            served_note(ex, replica)
            if ex.conversation is not None:
                self._moved(planned, replica.url)
        if self.shared.store is None:
            return
        writes: list[tuple[str, bytes, float]] = []
        found = ex.conversation
        state = found.state if found is not None else None
        hint: Hint | None = ex.routing_hint
        if state is not None and (hint is None or hint.shared_home != replica.url):
            # Written only when the shared record does not say this replica already (a new home, a move,
            # or a move made during a store outage that the shared copy has not heard of).
            value = orjson.dumps({"r": replica.url, "t": state.turn + 1, "at": round(time.time(), 6)})
            writes.append((HOME_PREFIX + state.id, value, self.shared.home_ttl_s))
        messages = (ex.chat or {}).get("messages")
        if hint is not None and hint.head is not None and isinstance(messages, list) and messages:
            since = 0
            last = state.last if state is not None else None
            if (state is not None and last is not None and state.replica == replica.url and not hint.drift
                    and (state.turn + 1) % REFRESH_EVERY_TURNS):
                since = len(last.messages)  # the previous turn wrote the sampled positions before this
            for key in prefix_index.entries(messages, hint.head, replica.url, since):
                writes.append((key, b"1", prefix_index.TTL_S))
        if writes:
            self.shared.spawn(self.shared.set_many(writes))


def _home_record(raw: bytes | None) -> tuple[str, int, float] | None:
    """(replica URL, turn, wall time) of a stored home record."""
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
        return str(d["r"]), int(d["t"]), float(d.get("at", 0.0))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _freshest_home(hint: Hint, state: "ConversationState | None") -> str | None:
    """The shared home record is written as soon as a replica accepts a turn; the conversation state
    only after that turn's analysis. Take whichever describes the later turn."""
    state_turn = state.turn if state is not None else 0
    state_home = state.replica if state is not None else None
    if hint.home is not None and (state_home is None or hint.home_turn >= state_turn):
        return hint.home
    return state_home


def _head_drift(state: "ConversationState | None", ex: Exchange, body: dict[str, Any], engine: str) -> str | None:
    """Did something the engine renders ahead of every message change since the conversation's last turn?"""
    last = state.last if state is not None else None
    if last is None:
        return None
    if (last.thinking is not None and ex.thinking_applied is not None
            and bool(last.thinking) != bool(ex.thinking_applied)):
        return "thinking"
    if ex.thinking_applied and last.effort is not None and ex.effort_applied is not None \
            and last.effort != ex.effort_applied:
        return "effort"
    if tools_digest(engine, body.get("tools")) != last.tools_digest:  # as the analysis fingerprints them
        return "tools"
    return None

