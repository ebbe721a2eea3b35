"""Hot path: find the request's conversation and hold its thinking mode and effort steady.

One store round trip (a multi-get of the anchors, then the state) and a pass of hashing over
the messages; rendering and comparing happen after the response (see analyzer.py).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..pipeline import messages_chat, responses_chat
from ..core.exchange import Exchange
from ..server.headers import token
from ..core.runtime import LaneRuntime
from ..store import StateStore
from . import effort as effort_mod
from .identity import Lineage, earlier_lineages, explicit_key, key_id, lineage, request_tail
from .found import Found
from .state import ConversationState, Head

REPIN_HEADER = "x-gateway-repin"


class ConversationPolicy:
    name = "conversation"
    per_lane = True

    def __init__(self, store: StateStore, header_name: str = "X-Conversation-Id", ttl_s: float = 6 * 3600,
                 arm_turn_end: Callable[[Exchange, LaneRuntime], None] | None = None) -> None:
        self.store = store
        self.header_name = header_name
        self.ttl_s = ttl_s
        self.arm_turn_end = arm_turn_end  # the turn-end write, before the answer's last bytes

    async def apply(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None:
        if ex.path == responses_chat.PATH:
            view = responses_chat.chat_view(body)  # linear in the input items
            ex.mapped_chat = view.body
            if view.unmapped is not None:
                ex.analysis_skipped = "responses: " + view.unmapped  # recorded, not analysed
                self._state_render_inputs(ex, lane, body)
        elif ex.path == messages_chat.PATH:
            view = messages_chat.chat_view(body)  # as vLLM translates it
            ex.mapped_chat = view.body
            if view.unmapped is not None:
                ex.analysis_skipped = "messages: " + view.unmapped
        chat = ex.chat
        messages = chat.get("messages") if chat is not None else None
        if chat is None or not isinstance(messages, list):  # /v1/completions: nothing to pin or compare
            return
        requested = effort_mod.resolve(chat, lane.config)
        lin = lineage(messages, lane.config.engine)
        state, is_new, anchor_turn, source = await self._identify(ex, chat, lin, lane)
        found = Found(state, lin, is_new, anchor_turn, requested)
        ex.conversation = found
        ex.conversation_id = state.id
        ex.conversation_source = source
        ex.turn = state.turn + 1
        if self.arm_turn_end is not None:
            self.arm_turn_end(ex, lane)
        self._pin(ex, lane, chat, found)
        if chat is not body and ex.path == responses_chat.PATH:
            responses_chat.tell_back(body, chat)  # the pin, in the Responses body the engine gets
        elif chat is not body and ex.path == messages_chat.PATH:
            messages_chat.tell_back(body, chat)  # ... and in the Messages body

    @staticmethod
    def _state_render_inputs(ex: Exchange, lane: LaneRuntime, body: dict[str, Any]) -> None:
        """A Responses request whose items cannot be read is not analysed, but the engine still gets the
        lane's render inputs stated (thinking, effort, drop_thinking), as on every other turn: left to
        the template's defaults, the model would leave thinking mode and the prefix would change."""
        if lane.config.render.template is None:
            return
        stub = responses_chat.render_inputs(body)
        requested = effort_mod.resolve(stub, lane.config)
        ex.effort_requested, ex.thinking_requested = requested.effort, requested.thinking
        ex.effort_applied, ex.thinking_applied = requested.effort, requested.thinking
        ex.effort_action = "stated"
        effort_mod.apply_to_body(stub, lane.config, bool(requested.thinking), requested.effort)
        responses_chat.tell_back(body, stub)

    async def _identify(self, ex: Exchange, body: dict[str, Any], lin: Lineage, lane: LaneRuntime):
        headers = ex.request_headers or {}
        key = explicit_key(body, headers, self.header_name)
        if key is not None:
            cid = key_id(key[0], ex.tenant)
            state = await self._load(cid)
            if state is not None:
                return state, False, None, key[1]
            return ConversationState(cid, key[1], lane=lane.name), True, None, key[1]
        keys = lin.anchor_keys(ex.tenant)
        if keys:
            for value in await self.store.mget(keys):
                if value is None:
                    continue
                cid, _, turn = value.decode().partition("|")
                state = await self._load(cid)
                if state is None:
                    continue
                anchor_turn = int(turn or 0)
                if anchor_turn < state.turn and not self._is_retry(state, lin, body["messages"], lane.config.engine):
                    # A second continuation of an earlier turn: a fork with a common ancestor.
                    fork = ConversationState(_new_id(), "lineage", lane=lane.name,
                                             turn=anchor_turn, pinned_effort=state.pinned_effort,
                                             pinned_thinking=state.pinned_thinking, parent=state.id,
                                             replica=state.replica, last=state.last)
                    return fork, False, anchor_turn, "lineage_fork"
                return state, False, anchor_turn, "lineage"
        if keys:
            rejoined = await self._rejoin(ex, body["messages"], lane)
            if rejoined is not None:
                return rejoined
        source = "new" if not keys else "lineage_unknown"
        return ConversationState(_new_id(), source, lane=lane.name), True, None, source

    async def _rejoin(self, ex: Exchange, messages: list, lane: LaneRuntime):
        """The latest assistant message is not one the gateway relayed (the client retried its turn, or
        edited or dropped the last answer): an earlier answer it relayed, at its position, names the
        conversation, which this turn continues (its drift names the edit)."""
        earlier = earlier_lineages(messages, lane.config.engine)
        if not earlier:
            return None
        keys = [lin.anchor_keys(ex.tenant)[0] for lin in earlier]  # at their positions only
        for value in await self.store.mget(keys):
            if value is None:
                continue
            cid, _, turn = value.decode().partition("|")
            state = await self._load(cid)
            if state is not None:
                return state, False, int(turn or 0), "lineage_rejoined"
        return None

    async def _load(self, cid: str) -> ConversationState | None:
        """The conversation's state, with its head (turn, pins, replica) as of the latest response.

        The full state lands when a turn's analysis is done; the head is written the moment the
        response ends, so a client that sends its next turn at once still gets the right turn
        number and pins.
        """
        raw, head_raw = await self.store.mget(["conv:" + cid, "head:" + cid])
        head = Head.from_bytes(head_raw) if head_raw else None
        if raw is None:
            return head.as_state(cid) if head is not None else None
        state = ConversationState.from_bytes(raw)
        if head is not None and head.turn > state.turn:
            head.apply(state)
        return state

    @staticmethod
    def _is_retry(state: ConversationState, lin: Lineage, messages: list, engine: str = "sglang") -> bool:
        """The same request as the conversation's latest turn, sent again."""
        if state.last is None or len(messages) != len(state.last.messages):
            return state.last is None and state.n_messages == len(messages)
        return request_tail(messages, engine) == state.last.request_chain

    def _pin(self, ex: Exchange, lane: LaneRuntime, body: dict[str, Any], found: Found) -> None:
        req = found.requested
        state = found.state
        ex.effort_requested = req.effort
        ex.thinking_requested = req.thinking
        policy = lane.config.effort_policy
        headers = ex.request_headers or {}
        repin = headers.get(REPIN_HEADER, "").lower() in ("1", "true", "yes")
        pinned = state.pinned_effort is not None or state.pinned_thinking is not None
        if found.is_new or not pinned or policy == "off":
            ex.effort_applied, ex.thinking_applied = req.effort, req.thinking
            ex.effort_action = "first" if found.is_new or not pinned else "off"
        elif (req.effort, req.thinking) == (state.pinned_effort, state.pinned_thinking):
            ex.effort_applied, ex.thinking_applied = req.effort, req.thinking
            ex.effort_action = "kept"
        elif repin:
            ex.effort_applied, ex.thinking_applied = req.effort, req.thinking
            ex.effort_action = "repinned"
            found.repinned = True
        elif policy == "pin":
            ex.effort_applied, ex.thinking_applied = state.pinned_effort, state.pinned_thinking
            ex.effort_action = "pinned"
        else:  # warn: forward what was asked, say what it will cost
            ex.effort_applied, ex.thinking_applied = req.effort, req.thinking
            ex.effort_action = "warned"
        if lane.config.render.template is not None and (policy != "off" or effort_mod.needs_translation(req)):
            # Say it explicitly, so the engine renders what the gateway predicts whatever its defaults
            # (with policy off, only when the client's word is one the engine would refuse, e.g. medium).
            effort_mod.apply_to_body(body, lane.config, bool(ex.thinking_applied), ex.effort_applied)
        if lane.config.render.template is not None:
            # Template-less lanes: the gateway does not know how the engine renders effort, so it says nothing.
            ex.response_headers["X-Gateway-Effort"] = _header(ex, state)
        ex.response_headers["X-Gateway-Conversation"] = f"{state.id}; turn={ex.turn}; via={ex.conversation_source}"


def _header(ex: Exchange, state: ConversationState) -> str:
    """`50; requested=100; pinned` — what the engine renders, and what the client asked when different.

    Efforts are the lane's numbers or words the client sent: each goes through `token`, so a value
    that is not a plain word or number reads "other" instead of reaching the header raw."""
    applied = token(ex.effort_applied) if ex.thinking_applied else "off"
    requested = token(ex.effort_requested) if ex.thinking_requested else "off"
    if ex.effort_action == "warned":
        pinned = token(state.pinned_effort) if state.pinned_thinking else "off"
        return f"{applied}; pinned={pinned}; warned"
    if requested != applied or ex.effort_action == "repinned":
        return f"{applied}; requested={requested}; {ex.effort_action}"
    return str(applied)


def _new_id() -> str:
    """A new conversation's id: 64 random bits, as uuid4().hex[:16] gave, without making a UUID."""
    return "c" + os.urandom(8).hex()
