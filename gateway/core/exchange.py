"""One request's journey through the gateway: what was asked, where it went, what came back, when.

The proxy fills it in on the hot path with plain attribute writes (cheap); everything that
needs thought (render, drift, records, metrics) reads it after the response has ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    from ..conversations.found import Found
    from ..pipeline.body_parts import Body
    from ..pipeline.history_memo import Parsed
    from .config import Lane
    from .verdict import CacheVerdict

CHAT_PATH = "/v1/chat/completions"


class Trace(Protocol):
    """One request's spans while it is in flight (held on the exchange; gateway/tracing/ makes them)."""

    def upstream_started(self, ex: "Exchange", lane: "Lane") -> str:
        """Start the span of the call to the engine; the W3C `traceparent` value that continues it."""
        ...

    def finish(self, ex: "Exchange", lane: "Lane | None") -> None:
        """End every span with the exchange's own timings and findings (after the analysis)."""
        ...


@dataclass
class GeneratedOutput:
    """What the model produced, accumulated from the relayed response."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    # vLLM with `return_token_ids`: the ids the engine prefilled and generated (compared with the render)
    prompt_token_ids: list[int] | bytes | None = None  # bytes = their JSON, parsed later
    token_ids: list[int] = field(default_factory=list)

    def add_tool_call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index", len(self.tool_calls))
        call = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        fn = delta.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            call["function"]["arguments"] += fn["arguments"]

    def as_message(self) -> dict[str, Any]:
        """The assistant message a client would append to its history for the next turn."""
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


@dataclass
class Healed:
    """Drift healing's repairs of one kind: the messages it repaired (indices, ascending) and, after the
    analysis, the cached prompt tokens they saved (the prefix kept beyond what the client's own bytes
    would have kept)."""

    kind: str
    indices: list[int]
    tokens_saved: int | None = None
    repairs_prefix: bool = True  # False: a restatement the engine renders the same (it saves no tokens)


@dataclass
class LimitNotes:
    """What the lane limits did to this request (rewrites, refusals, the exact count near the window)."""

    rejected: str | None = None  # the limit that refused the request
    error: str | None = None  # a limit that failed inside the gateway (it then lets the request pass)
    images_dropped: list[str] = field(default_factory=list)  # params of images replaced by a marker
    top_logprobs_clamped: dict[str, int] | None = None  # {"requested": n, "forwarded": cap}
    placeholders_escaped: list[str] = field(default_factory=list)
    prompt_tokens_counted: dict[str, Any] | None = None  # {"n", "how", "bound"}
    # A rewrite of history the analysis must explain as a cause of its own, e.g.
    # {"cause": "image_removed", "message_index": 3}.
    history_rewritten: dict[str, Any] | None = None


@dataclass
class RateLimitNote:
    """What the per-tenant rate limits did to a request: the slots it holds, what its answer is charged to."""

    held: list[str] = field(default_factory=list)  # concurrency gauges to release at the end
    charged: list[tuple[str, str]] = field(default_factory=list)  # (token window, what it counts)
    refused: str | None = None  # the limit that refused it (e.g. "team-a requests_per_minute")
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadAtMove:
    """Why a conversation left an overloaded home: in-flight requests there, the lane's mean, the bound."""

    home: float | None
    mean: float
    bound: float


@dataclass(frozen=True, slots=True)
class Room:
    """A moved conversation's prefix against the room the chosen pool had for it (KV events), in tokens."""

    needed: int
    chosen: int | None


@dataclass(slots=True)
class RouteDecision:
    """What the lane's router decided for this request (routing/base.py) and what failover changed."""

    policy: str
    replica: str  # the replica that serves it (after failover)
    reason: str  # home | prefix | least_loaded | rehomed_overload | rehomed_unhealthy, or the policy's name
    expected_cold: bool  # the conversation's KV cache is not where this turn runs
    previous: str | None = None  # where the conversation's last turn ran
    planned: str | None = None  # failover: the replica planned first
    failover: bool = False
    drift: str | None = None  # what changed at the prompt's head (thinking, effort, tools)
    load: LoadAtMove | None = None
    share: float | None = None  # the placed prefix's share of the prompt
    room: Room | None = None


@dataclass
class AdmissionNote:
    """What cache-protecting admission decided for a new conversation, and from which figures."""

    decision: str  # admitted | admitted_after_hold | admitted_after_timeout | refused | refused_after_hold
    # | diverted
    reason: str
    waited_s: float = 0.0
    need_tokens: int = 0  # the room the new conversation was judged to need
    active_tokens: int = 0  # the lane's active working set when decided
    pool_tokens: int | None = None
    active_conversations: int = 0
    lane: str | None = None  # the lane that decided
    diverted_to: str | None = None  # policy divert: the lane with room it was sent to


@dataclass
class Exchange:
    request_id: str
    path: str = "/v1/chat/completions"
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)

    public_model: str | None = None
    lane: str | None = None
    replica: str | None = None
    stream: bool = False
    client_wants_usage: bool = False
    body: dict[str, Any] | None = None
    body_bytes: int = 0
    history: "Parsed | None" = None  # how the body was read (history_memo.py): the history it shares with a turn
    forwarded: "Body | None" = None  # the body as sent upstream, bytes or parts (what the analysis renders)
    # token ids: the gateway asked the engine for them (the client did not): strip them
    token_ids_strip: bool = False
    token_ids_why: str | None = None  # token ids: why they were not asked for
    request_headers: Any = None  # the client's headers (a case-insensitive mapping)

    status: int = 0
    error_code: str | None = None
    error_message: str | None = None
    upstream_error: str | None = None
    retries: int = 0
    cancelled: bool = False
    # Awaited (each with a deadline) once the whole answer is known, before its last bytes go to the
    # client: the turn-end write, so that the client's next turn finds its conversation on any gateway.
    answered: "list[Callable[[], Awaitable[None]]]" = field(default_factory=list)
    turn_written: bool = False  # the turn-end write was made before the last byte

    # Policies on the hot path (limits, effort pinning) write what they did here.
    conversation_id: str | None = None
    conversation_source: str | None = None
    turn: int | None = None
    effort_requested: Any = None
    effort_applied: Any = None
    effort_action: str | None = None
    thinking_requested: bool | None = None
    thinking_applied: bool | None = None
    limits_fired: list[str] = field(default_factory=list)
    limits: LimitNotes = field(default_factory=LimitNotes)
    fallback_from: str | None = None  # the lane the model maps to, when another lane served it
    response_bytes: int = 0  # body bytes sent to the client (the access log)
    response_headers: dict[str, str] = field(default_factory=dict)

    # Who asked: the tenant of the client key (its id, never the key); "default" without keys.
    tenant: str = "default"

    # What the parts tell each other, typed (written on the hot path, read after the response).
    conversation: "Found | None" = None  # the conversation policy's finding, for routing and analysis
    # A /v1/responses request as the chat request the engine renders (gateway/pipeline/responses_chat.py), set by
    # the conversation policy; None when it does not map (the reason is in analysis_skipped). Read it
    # through `chat`, never directly.
    mapped_chat: dict[str, Any] | None = None
    # The engine's API when the gateway translates the client's (Anthropic Messages on a lane whose
    # engine does not serve it goes as chat completions: pipeline/messages_from_chat.py); None: the same.
    upstream_path: str | None = None
    routing: RouteDecision | None = None  # the replica decision
    routing_single: bool = False  # the lane has one replica: no routing lookups were made
    routing_hint: Any = None  # what the affinity router read from the store before choosing
    routing_urls: list[str] = field(default_factory=list)  # replicas in the order they were tried
    cache: CacheVerdict | None = None  # the analysis verdict (core/verdict.py)
    healed: "list[Healed]" = field(default_factory=list)  # drift healing's repairs (gateway/heal/)
    analysis_ms: float | None = None
    analysis_skipped: str | None = None  # why this turn got no analysis (e.g. "queue_full")
    state_bytes: int | None = None
    admission: AdmissionNote | None = None  # cache-protecting admission's decision (new conversations only)
    rate_limits: RateLimitNote | None = None  # per-tenant rate limits (gateway/ratelimits/)
    qualification: str | None = None  # "overridden" when an unqualified lane served under override
    qualification_run: bool = False  # sent by `gateway qualify` through the qualify route

    trace: Trace | None = None  # the request's spans while tracing is on (gateway/tracing/)

    # Timings, perf_counter seconds.
    t_forwarded: float | None = None
    t_first_byte: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_end: float | None = None
    token_chunk_times: list[float] = field(default_factory=list)

    usage: dict[str, Any] | None = None
    generated: GeneratedOutput = field(default_factory=GeneratedOutput)

    @property
    def chat(self) -> dict[str, Any] | None:
        """The request as chat messages, for the conversation policy, the analysis and what reads their
        findings (routing, records): a chat request is its own view; a /v1/responses request has its
        mapping; anything else (completions, embeddings, a Responses request continuing engine-side
        state) has none."""
        if self.path == CHAT_PATH:
            return self.body
        return self.mapped_chat

    def rerouted(self, lane: str, headers: dict[str, str]) -> "Exchange":
        """A fresh exchange for this request on another lane (runtime.Reroute): what the request brought
        and what the lane-independent steps decided carry over (its id, times, caller, rate limits,
        trace, and `headers`: the response headers set before the first per-lane policy); everything a
        per-lane step finds is found again."""
        return Exchange(request_id=self.request_id, path=self.path, started_wall=self.started_wall,
                        started=self.started, public_model=self.public_model, lane=lane, stream=self.stream,
                        body_bytes=self.body_bytes, request_headers=self.request_headers, tenant=self.tenant,
                        rate_limits=self.rate_limits, trace=self.trace, qualification_run=self.qualification_run,
                        response_headers=dict(headers))

    def fire_limit(self, name: str) -> None:
        if name not in self.limits_fired:
            self.limits_fired.append(name)

    def fail(self, status: int, code: object, message: str) -> None:
        """The request failed. An upstream's null or absent code stays absent, never the string "None"."""
        self.status = status
        self.error_code = None if code is None else str(code)
        self.error_message = message
