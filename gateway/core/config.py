"""routes.yaml: the file admins edit. Lanes, their replicas and policies, and public model aliases.

Everything is validated on load with pydantic; an error names the offending key path, e.g.
``lanes.dsv41.replicas.0: not an http(s) URL``. A config object is immutable once loaded: a reload
builds a new one and swaps it in whole.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator


class ConfigError(ValueError):
    """routes.yaml could not be used; the message names the key path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    connect: float = Field(2.0, gt=0, description="seconds to open a TCP connection to a replica")
    first_byte: float = Field(120.0, gt=0, description="seconds until the upstream's response headers")
    idle: float = Field(60.0, gt=0, description="seconds allowed between two chunks of a stream")
    keep_alive: float = Field(4.0, gt=0, description="seconds an idle pooled connection to a replica is kept; "
                                                     "below the engines' own (vLLM and SGLang run uvicorn with "
                                                     "5 s), so the gateway never sends on a connection the "
                                                     "engine is closing")


# Reasoning-effort words a client may send: OpenAI's (`none` turns thinking off) plus `max`, which the
# DeepSeek-V4.1 engines know. SGLang's and vLLM's V4.1 encoders (encoding_dsv41.py,
# deepseek_v41_encoding.py) map low/high/xhigh/max to 25/50/75/100, default "high", and refuse
# minimal/medium with a 400; vLLM's V4 encoder folds minimal/medium into low. The gateway accepts
# them all and forwards the number, so the engine never sees a word it refuses.
EFFORT_WORDS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
DEFAULT_EFFORT_MAP: dict[str, int] = {"minimal": 25, "low": 25, "medium": 50, "high": 50, "xhigh": 75, "max": 100}
# A lane's map that leaves a word out gets it from its nearest neighbour in that map: minimal as
# low, medium as high (OpenAI's default equals the engines' default "high": the same render, the
# same cache), xhigh as high (vLLM's patch of the release table keeps xhigh = high).
_EFFORT_FALLBACK = {"minimal": "low", "medium": "high", "xhigh": "high"}


def complete_effort_map(given: dict[str, int] | None) -> dict[str, int]:
    """The lane's map with every word of EFFORT_WORDS but `none` (which means thinking off)."""
    if not given:
        return dict(DEFAULT_EFFORT_MAP)
    out = dict(given)
    for word in ("low", "high", "max"):
        out.setdefault(word, DEFAULT_EFFORT_MAP[word])
    for word, like in _EFFORT_FALLBACK.items():
        out.setdefault(word, out[like])
    return out


Carry = Literal["reasoning_effort", "chat_template_kwargs", "thinking"]
DEFAULT_CARRY: tuple[Carry, ...] = ("reasoning_effort", "chat_template_kwargs")


class RenderConfig(_Strict):
    """How the lane's engine renders a request (gateway/render)."""

    template: str | None = Field("deepseek_v4.1", description="a packaged template's name (gateway/chat_templates/"
                                 "<name>.jinja), or a .jinja file relative to routes.yaml; null = no known template")
    tokenizer_path: str | None = None
    effort_map: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_EFFORT_MAP), validate_default=True,
        description="effort word -> the number the template renders (1-100); words left out are filled in "
                    "(see DEFAULT_EFFORT_MAP and complete_effort_map)")
    default_effort: str | int | None = None
    thinking: bool = True
    drop_thinking: bool = True
    # How the request carries thinking/effort to this engine.
    carry: list[Carry] = Field(default_factory=lambda: list(DEFAULT_CARRY))

    @field_validator("effort_map", mode="before")
    @classmethod
    def _effort_map(cls, given: Any) -> Any:
        if given is None:
            return dict(DEFAULT_EFFORT_MAP)
        if not isinstance(given, dict):
            return given  # pydantic names the type error
        for word, number in given.items():
            if word == "none":
                raise ValueError("effort_map.none: 'none' turns thinking off and cannot map to a number")
            if not isinstance(word, str) or not word.isidentifier():
                raise ValueError(f"effort_map: {word!r} is not a word")
            if type(number) is not int or not 1 <= number <= 100:
                raise ValueError(f"effort_map.{word}: {number!r} must be an integer 1-100")
        return complete_effort_map(given)

    @model_validator(mode="after")
    def _default_effort(self) -> "RenderConfig":
        d = self.default_effort
        if d is None or (type(d) is int and 1 <= d <= 100) or (isinstance(d, str) and d in self.effort_map):
            return self
        raise ValueError(f"default_effort {d!r} must be an integer 1-100 or one of {', '.join(self.effort_map)}")

    @field_validator("template")
    @classmethod
    def _template_exists(cls, name: str | None, info: ValidationInfo) -> str | None:
        # A missing template refuses the file (at start, reload and `gateway check`): never a generic render.
        # A file is kept as its absolute path, so every process and the analysis worker read the same one.
        if name is None:
            return None
        from ..render.template import resolve_template

        return resolve_template(name, (info.context or {}).get("routes_dir"))

    @field_validator("tokenizer_path")
    @classmethod
    def _tokenizer_exists(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is None:
            return None
        p = Path(path).expanduser()
        p = (p if p.is_absolute() else Path((info.context or {}).get("routes_dir") or Path.cwd()) / p).resolve()
        if not p.is_file():
            raise ValueError(f"no tokenizer file at {p}")
        return str(p)


LimitPolicy = Literal["reject", "drop_oldest", "clamp", "escape"]


class Limits(_Strict):
    max_images: int | None = Field(None, ge=0)
    images_policy: Literal["reject", "drop_oldest"] = "reject"
    max_top_logprobs: int | None = Field(None, ge=0)
    top_logprobs_policy: Literal["reject", "clamp"] = "reject"
    max_context_tokens: int | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, gt=0)
    placeholder_tokens: list[str] = Field(default_factory=list)
    placeholder_policy: Literal["reject", "escape"] = "reject"
    max_request_bytes: int | None = Field(None, gt=0)
    max_messages: int | None = Field(None, gt=0)

    @field_validator("placeholder_tokens")
    @classmethod
    def _placeholders(cls, tokens: list[str]) -> list[str]:
        for i, t in enumerate(tokens):
            # escape inserts U+200D after the first character: a token needs two, and none of its own
            if len(t) < 2 or "\u200d" in t:
                raise ValueError(f"placeholder_tokens.{i}: {t!r} must be at least 2 characters, without U+200D")
        if len(set(tokens)) != len(tokens):
            raise ValueError("placeholder_tokens: the same token is listed twice")
        return tokens

    @model_validator(mode="after")
    def _output_fits_window(self) -> "Limits":
        if self.max_output_tokens is not None and self.max_context_tokens is not None \
                and self.max_output_tokens >= self.max_context_tokens:
            raise ValueError("max_output_tokens must be smaller than max_context_tokens")
        return self


class CacheModel(_Strict):
    """What the gateway knows about the lane's prefix cache, to predict hits."""

    block_size: int = Field(1, ge=1, description="cached tokens come in whole blocks of this many tokens; unset "
                            "in routes.yaml: the engine's default (vLLM 16, SGLang and others 1)")
    prefill_tokens_per_s: float = Field(20000.0, gt=0, description="to turn tokens lost into seconds lost")
    pool_tokens: int | None = Field(None, gt=0, description="each replica's KV pool in tokens, for the gateway's "
                                    "model of its prefix cache (LRU by block); null: modelled as 4M tokens "
                                    "(bounded memory)")


class Admission(_Strict):
    """Admission that protects the prefix cache (gateway/admission/): what happens to a NEW conversation
    when the lane's pool cannot hold it beside the conversations already active. Turns of conversations
    already in flight are never held."""

    policy: Literal["admit", "hold", "refuse", "divert"] = Field(
        "admit", description="admit: always (no protection); hold: wait up to `hold_s` for room, then `then`; "
                             "refuse: answer `status` at once; divert: send it to the first `divert_to` lane "
                             "with room (its later turns follow it there), else hold as `hold` does")
    hold_s: float = Field(30.0, gt=0, le=600, description="the longest a new conversation waits for room")
    divert_to: list[str] = Field(default_factory=list, description="policy divert: the lanes a newcomer may be "
                                 "sent to, in order (each judged by its own pool and active conversations)")
    then: Literal["admit", "refuse"] = Field("refuse", description="after `hold_s` without room")
    status: Literal[429, 503] = Field(429, description="the answer of a refused conversation (with Retry-After)")
    idle_after_s: float = Field(120.0, gt=0, description="a conversation with no turn for this long leaves the "
                                                         "working set (its prefix may be evicted without harm)")
    reserve_tokens: int = Field(0, ge=0, description="room a new conversation needs at least (its first prompt's "
                                                     "tokens when larger): what it will grow to")
    pool_tokens: int | None = Field(None, gt=0, description="the lane's KV pool in tokens (all replicas); default: "
                                                            "the pools its KV events report")

    @model_validator(mode="after")
    def _divert_names_lanes(self) -> "Admission":
        if self.policy == "divert" and not self.divert_to:
            raise ValueError("divert_to: policy divert needs at least one lane to send newcomers to")
        if len(set(self.divert_to)) != len(self.divert_to):
            raise ValueError("divert_to: a lane is listed twice")
        return self


class Breaker(_Strict):
    """Per-replica circuit breaker: open after N consecutive failures, probe again after a cool-down."""

    failures: int = Field(3, ge=1)
    cool_down_s: float = Field(5.0, gt=0)
    probe_interval_s: float | None = Field(None, gt=0, description="active health probe every so often; "
                                                                     "None = passive health from traffic only")
    probe_path: str = Field("/v1/models", pattern=r"^/", description="GET this on each replica to probe it")


class Affinity(_Strict):
    """conversation_affinity routing: when a home is overloaded, and when a new conversation follows a prefix."""

    max_load_factor: float = Field(1.25, ge=1.0, description="a home with more in-flight requests than this x the "
                                                            "lane's mean (+ load_slack) is overloaded: re-home")
    load_slack: float = Field(1.0, ge=0, description="added to the bound so an idle lane does not bounce")
    load_window_s: float = Field(2.0, ge=0, description="the home must also be over the bound on average over "
                                                        "about this many seconds (0: the instant count alone)")
    prefix_min_share: float = Field(0.5, ge=0, le=1, description="a new conversation follows a known prefix only "
                                                                "when it covers this share of its messages")
    prefix_source: Literal["messages", "kv_events"] = Field(
        "messages", description="where a new conversation's prefix is looked up: the gateway's own record of "
                                "what each replica served (messages), or the engines' KV events (kv_events: "
                                "what each pool actually holds; re-homing then prefers the pool with room)")


# -- KV-cache events (gateway/kvevents) ---------------------------------------------------------------


class KVEventsPublisher(_Strict):
    """One replica's KV-event publisher: vLLM `--kv-events-config` (`endpoint`, `replay_endpoint`, `topic`)
    or SGLang's equivalent, as the gateway reaches it."""

    endpoint: str = Field(description="the engine's ZMQ PUB socket, e.g. tcp://10.0.0.5:5557 (with `bind`: "
                                      "the address the gateway binds for the engine to connect to)")
    bind: bool = Field(False, description="the engine's publisher connects to the gateway (vLLM connects when its "
                                          "endpoint has no `*`, e.g. tcp://gateway-host:5557); default: the engine "
                                          "binds (tcp://*:5557) and the gateway connects")
    replay: str | None = Field(None, description="its replay (ROUTER) socket, e.g. tcp://10.0.0.5:5558; "
                                                 "without it a gap in the stream is lost for good")
    topic: str = Field("", description="the topic the engine publishes on ('' = vLLM's default)")
    pool_tokens: int | None = Field(None, gt=0, description="the KV pool in tokens; default: read from the "
                                                            "engine's /metrics (vllm:cache_config_info)")

    @field_validator("endpoint", "replay")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in ("tcp", "ipc") or not rest or "*" in rest:
            raise ValueError(f"{value!r} is not a ZMQ address to connect to (tcp://host:port or ipc://path)")
        return value


class KVEvents(_Strict):
    """The lane's KV-event streams, one per replica (keyed by the replica URL as listed under `replicas`)."""

    replicas: dict[str, KVEventsPublisher] = Field(min_length=1)
    max_blocks: int = Field(500_000, ge=1024, description="per replica: blocks kept in the index (and as many "
                                                          "removal records), ~500 bytes each: 250 MB at most by "
                                                          "default; at least the pool's blocks (SGLang with "
                                                          "page_size 1: one block per token)")
    half_life_s: float = Field(900.0, gt=0, description="working set: a prefix idle this long counts half")
    live_for_s: float = Field(3600.0, gt=0, description="a conversation idle longer leaves the working set")
    rate_window_s: float = Field(300.0, gt=0, description="new tokens per second are measured over this")

    @field_validator("replicas")
    @classmethod
    def _urls(cls, replicas: dict[str, KVEventsPublisher]) -> dict[str, KVEventsPublisher]:
        return {url.rstrip("/"): pub for url, pub in replicas.items()}


class Override(_Strict):
    reason: str = Field(min_length=1)


class EmulatedUpstream(_Strict):
    """Demo lanes: `gateway demo` starts the built-in emulator on each replica's port."""

    flavour: Literal["vllm", "sglang"] = "vllm"
    knobs: dict[str, Any] = Field(default_factory=dict)


FailoverTrigger = Literal["connect", "timeout"] | int
HealKind = Literal["arguments", "reasoning", "content", "tool_result_order", "reasoning_field"]


# The prefix cache's block size when a lane does not say: each engine's own default (vLLM's
# --block-size; SGLang's --page-size).
ENGINE_BLOCK_SIZE = {"vllm": 16, "sglang": 1}


class Lane(_Strict):
    engine: Literal["sglang", "vllm", "openai"] = "vllm"
    replicas: list[str] = Field(min_length=1)
    upstream_model: str = Field(min_length=1)
    revision: str | None = Field(None, description="model revision/build, part of the lane's qualified identity; "
                                                   "default: the `root` a replica reports on GET /v1/models")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the upstream key")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    breaker: Breaker = Field(default_factory=Breaker)
    render: RenderConfig = Field(default_factory=RenderConfig)
    limits: Limits = Field(default_factory=Limits)
    effort_policy: Literal["pin", "warn", "off"] = "pin"
    reasoning_field: Literal["reasoning", "reasoning_content", "both"] | None = Field(
        None, description="the field clients get the reasoning in; None: whatever the engine sends")
    cache: CacheModel = Field(default_factory=CacheModel)
    routing: Literal["round_robin", "least_inflight", "conversation_affinity"] = "conversation_affinity"
    affinity: Affinity = Field(default_factory=Affinity)
    qualification: Literal["required", "not_required"] = "required"
    override: Override | None = None
    emulator: EmulatedUpstream | None = None
    kv_events: KVEvents | None = None  # the replicas' KV-cache event streams
    admission: Admission = Field(default_factory=Admission)
    token_ids: Literal["auto", "off"] = Field(
        "auto", description="ask the engine for prompt and generated token ids so the analysis compares content, "
                            "not counts (gateway/pipeline/token_ids.py): 'auto' asks a vllm lane on chat "
                            "completions and removes them from the answer unless the client asked itself; 'off' never")
    failover_on: tuple[FailoverTrigger, ...] = Field(
        ("connect", 502, 503, 504),
        description="what makes a request try the next replica, before the first byte reaches the client: "
                    "'connect' (refused, reset, bad HTTP), 'timeout' (no answer within first_byte), "
                    "or an HTTP status (429 or 5xx)")

    @field_validator("failover_on")
    @classmethod
    def _failover(cls, triggers: tuple) -> tuple:
        for i, t in enumerate(triggers):
            if isinstance(t, int) and not (t == 429 or 500 <= t <= 599):
                raise ValueError(f"failover_on.{i}: {t} is not 429 or a 5xx status")
        if len(set(triggers)) != len(triggers):
            raise ValueError("failover_on: the same trigger is listed twice")
        return triggers

    # -- drift healing (gateway/heal/) ------------------------------------------------------------
    heal: list[HealKind] = Field(default_factory=list, description="client edits the gateway repairs "
                                 "before forwarding (same meaning, the bytes it relayed); off by default")

    @field_validator("heal")
    @classmethod
    def _heal_kinds(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError("the same heal kind is listed twice")
        return kinds

    @field_validator("replicas")
    @classmethod
    def _urls(cls, replicas: list[str]) -> list[str]:
        out = []
        for i, url in enumerate(replicas):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"replicas.{i}: {url!r} is not an http(s) URL")
            out.append(url.rstrip("/"))
        if len(set(out)) != len(out):
            raise ValueError("the same replica URL is listed twice")
        return out

    @model_validator(mode="before")
    @classmethod
    def _engine_block_size(cls, data: Any) -> Any:
        """A prediction in another block size than the engine's is never exact: unset, it is the engine's."""
        if isinstance(data, dict):
            cache = data.get("cache", {})
            if isinstance(cache, dict) and "block_size" not in cache:
                engine = data.get("engine", "vllm")
                block = ENGINE_BLOCK_SIZE.get(engine, 1) if isinstance(engine, str) else 1
                data = {**data, "cache": {**cache, "block_size": block}}
        return data

    @model_validator(mode="after")
    def _kv_events_replicas(self) -> "Lane":
        if self.kv_events is not None:
            for url in self.kv_events.replicas:
                if url not in self.replicas:
                    raise ValueError(f"kv_events.replicas.{url}: not one of the lane's replicas")
        if self.affinity.prefix_source == "kv_events" and self.kv_events is None:
            raise ValueError("affinity.prefix_source: kv_events needs the lane's kv_events")
        return self

    def upstream_api_key(self) -> str | None:
        # A secret, from the variable this file names: read here, when the lane is (re)built, never in Settings.
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ClientKeys(_Strict):
    """Client API keys, by reference only: never the keys themselves."""

    env: str | None = Field(None, description="env var with comma-separated keys")
    hashed_file: str | None = Field(None, description="file of sha256 hex digests, one per line")


# -- the gateway's own HTTP server and browser access ---------------------------------------------


class HttpServer(_Strict):
    """Deadlines of the gateway's HTTP server. Read when the server starts (not on reload)."""

    header_timeout_s: float = Field(10.0, gt=0, description="a connection must send a request's headers within "
                                                            "this many seconds of starting it (else 408, closed)")
    body_timeout_s: float = Field(60.0, gt=0, description="the whole request body must arrive within this many "
                                                          "seconds of the headers (else 408, closed)")
    keep_alive_s: float = Field(75.0, gt=0, description="an idle client connection is kept this long; above "
                                                        "the clients' own pools (httpx 5 s, aiohttp 15 s, "
                                                        "undici 4 s) so the client, not the gateway, closes it")


class Cors(_Strict):
    """Browsers on these origins may call the API (`*` = any origin; credentials are never allowed)."""

    allow_origins: list[str] = Field(min_length=1)
    allow_headers: list[str] = Field(default_factory=lambda: ["*"])
    expose_headers: list[str] = Field(default_factory=lambda: ["X-Request-Id"])
    max_age_s: int = Field(600, ge=0)

    @field_validator("allow_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for i, origin in enumerate(origins):
            if origin == "*":
                continue
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query \
                    or parts.fragment or origin.endswith("/"):
                raise ValueError(f"allow_origins.{i}: {origin!r} is not an origin like https://app.example.com")
        return origins


class RecordsConfig(_Strict):
    """Where request records go. Default: a SQLite file per host (`<data-dir>/records.sqlite3`).

    `postgres` (or an env var holding the URL, `postgres_env`, to keep a password out of this file;
    libpq's PGPASSWORD and ~/.pgpass work too): every gateway of a fleet writes to and reads from
    one database, so the admin page, `gateway stats` and `gateway drift` show the whole fleet.
    """

    postgres: str | None = Field(None, description="postgresql://user@host:5432/dbname")
    postgres_env: str | None = Field(None, description="env var holding the postgresql:// URL")
    max_age_days: float = Field(30.0, gt=0, description="PostgreSQL retention: delete older records")
    max_rows: int = Field(10_000_000, gt=0, description="PostgreSQL retention: keep at most this many")
    max_queue: int = Field(100_000, gt=0, description="records held in memory while the database is away")

    @field_validator("postgres")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("postgresql", "postgres"):
            raise ValueError("not a postgresql:// URL")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "RecordsConfig":
        if self.postgres and self.postgres_env:
            raise ValueError("give postgres or postgres_env, not both")
        return self

    def postgres_url(self) -> str | None:
        if self.postgres_env:  # a secret (the URL's password), from the variable this file names
            return os.environ.get(self.postgres_env) or None
        return self.postgres


TokenCount = Literal["uncached_prompt+completion", "prompt+completion", "uncached_prompt", "completion"]


class RateLimit(_Strict):
    """Per-tenant limits (gateway/ratelimits/): every rule that matches a request applies."""

    tenant: str = Field("*", min_length=1, description="a tenant label, or * for every tenant (each its own budget)")
    model: str | None = Field(None, description="a public model name: the budget is per model; null: one budget "
                                                "across models")
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)
    tokens: TokenCount = Field("uncached_prompt+completion", description="what tokens_per_minute counts, from the "
                               "engine's usage after each answer: by default the tokens the engine computes (a "
                               "prompt's cached tokens cost it almost nothing)")
    concurrent: int | None = Field(None, gt=0, description="requests in flight at once")
    wait_s: float = Field(0.0, ge=0, le=120, description="wait up to this long for room instead of answering 429")

    @model_validator(mode="after")
    def _limits_something(self) -> "RateLimit":
        if self.requests_per_minute is None and self.tokens_per_minute is None and self.concurrent is None:
            raise ValueError("a rate limit sets requests_per_minute, tokens_per_minute or concurrent")
        return self


class GatewaySection(_Strict):
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0)
    max_json_members: int = Field(
        200_000, gt=0, description="object members (\"key\": value pairs) a request body may hold; its parse holds "
                                   "the event loop for every member, so a body of a million is refused before it "
                                   "is parsed (a 1,600-message agent session holds about 10,000)")
    conversation_header: str = "X-Conversation-Id"
    client_keys: ClientKeys | None = None
    admin_key_env: str | None = None
    http: HttpServer = Field(default_factory=HttpServer)
    cors: Cors | None = None
    records: RecordsConfig = Field(default_factory=RecordsConfig)
    rate_limits: list[RateLimit] = Field(default_factory=list, description="per-tenant rate limits")


class ModelRoute(_Strict):
    """The long form of a public model: `name: {lane: a, fallbacks: [b, c], owned_by: acme}`."""

    lane: str = Field(min_length=1)
    fallbacks: list[str] = Field(default_factory=list, description="lanes tried in order when the lane is "
                                 "refused (qualification) or has no healthy replica")
    owned_by: str | None = Field(None, description="what GET /v1/models says; default: gateway")


class RoutesConfig(_Strict):
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    lanes: dict[str, Lane] = Field(min_length=1)
    # After validation every value is the lane's name (a str): the long form is split into
    # `fallbacks` and `owned_by` below, so readers of `models` see one shape (the type checker too).
    if TYPE_CHECKING:
        models: dict[str, str]
    else:
        models: dict[str, str | ModelRoute] = Field(min_length=1, description="public model name -> lane name "
                                                                              "(or {lane, fallbacks, owned_by})")
    fallbacks: dict[str, list[str]] = Field(default_factory=dict, description="public model name -> fallback lanes")
    owned_by: dict[str, str] = Field(default_factory=dict, description="public model name -> owned_by")

    @model_validator(mode="after")
    def _aliases_point_at_lanes(self) -> "RoutesConfig":
        models: dict[str, str] = {}
        fallbacks = dict(self.fallbacks)
        owned = dict(self.owned_by)
        for alias, route in self.models.items():
            if isinstance(route, ModelRoute):
                models[alias] = route.lane
                if route.fallbacks:
                    fallbacks[alias] = list(route.fallbacks)
                if route.owned_by:
                    owned[alias] = route.owned_by
            else:
                models[alias] = route
        for alias, lane in models.items():
            if lane not in self.lanes:
                raise ValueError(f"models.{alias}: lane {lane!r} is not defined under lanes")
        for alias, lanes in fallbacks.items():
            if alias not in models:
                raise ValueError(f"fallbacks.{alias}: no such model under models")
            for i, lane in enumerate(lanes):
                if lane not in self.lanes:
                    raise ValueError(f"models.{alias}.fallbacks.{i}: lane {lane!r} is not defined under lanes")
                if lane == models[alias] or lanes.index(lane) != i:
                    raise ValueError(f"models.{alias}.fallbacks.{i}: lane {lane!r} is listed twice")
        for name, spec in self.lanes.items():
            for i, other in enumerate(spec.admission.divert_to):
                if other not in self.lanes:
                    raise ValueError(f"lanes.{name}.admission.divert_to.{i}: lane {other!r} is not defined under lanes")
                if other == name:
                    raise ValueError(f"lanes.{name}.admission.divert_to.{i}: a lane cannot divert to itself")
        object.__setattr__(self, "models", models)  # frozen: set once, here, before anyone reads it
        object.__setattr__(self, "fallbacks", fallbacks)
        object.__setattr__(self, "owned_by", owned)
        return self

    def lane_for(self, model: str) -> tuple[str, Lane] | None:
        name = self.models.get(model)
        return (name, self.lanes[name]) if isinstance(name, str) else None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses duplicate keys (a duplicated alias must not silently win)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        seen[key] = loader.construct_object(value_node, deep=deep)
    return seen


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_routes(text: str, source: str = "routes.yaml", routes_dir: str | Path | None = None) -> RoutesConfig:
    """Validate routes.yaml text; files it names (templates) are relative to `routes_dir` (default: cwd)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc, source)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with 'lanes' and 'models'")
    try:
        return RoutesConfig.model_validate(data, context={"routes_dir": routes_dir})
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(err, text, source) for err in exc.errors())) from None


def load_routes(path: str | Path) -> RoutesConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_routes(text, str(path), path.resolve().parent)


def _yaml_error(exc: yaml.YAMLError, source: str) -> str:
    """One line: `routes.yaml:12: not valid YAML: <problem> (column 3)`."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"{source}: not valid YAML: {problem}"
    context = getattr(exc, "context", None)
    return (f"{source}:{mark.line + 1}: not valid YAML: {problem}"
            + (f" ({context})" if context else "") + f" at column {mark.column + 1}")


def _describe(err: Any, text: str, source: str) -> str:
    """`routes.yaml:21: lanes.a.render.template: <why>`: file, line and key path."""
    from .yaml_lines import key_line

    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    msg = msg.removeprefix("Value error, ")
    line = key_line(text, err["loc"])
    at = f"{source}:{line}" if line else source
    return f"{at}: {where}: {msg}" if where else f"{at}: {msg}"
