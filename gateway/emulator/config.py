"""Emulator knobs: one dataclass, merged from CLI flags, POST /emulator/config and a per-request header."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

Flavour = Literal["vllm", "sglang"]

# Per-flavour defaults for knobs left at None (the engines differ here).
_FLAVOUR_DEFAULTS: dict[str, dict[str, Any]] = {
    # vLLM >= 0.16 streams `reasoning`; its prefix cache hashes 16-token blocks; --max-logprobs 20.
    "vllm": {"reasoning_field": "reasoning", "block_size": 16, "max_top_logprobs": 20},
    # SGLang keeps `reasoning_content`; its radix cache matches per token; top_logprobs bounded by vocab.
    "sglang": {"reasoning_field": "reasoning_content", "block_size": 1, "max_top_logprobs": 129280},
}

REASONING_FIELDS = ("reasoning", "reasoning_content", "both")


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """Every knob of the emulator. Frozen: a change makes a new config, so a request keeps the one it began with."""

    # identity
    flavour: Flavour = "vllm"
    model: str = "deepseek-v4-flash"
    model_root: str | None = None  # vLLM's `root` (model path); None = derived from the model name
    max_model_len: int = 65536
    strict_model: bool = False  # vLLM answers 404 for an unknown model name; off so any name works
    tokenizer: Literal["simple", "dsv41"] = "simple"

    # output
    seed: int = 0
    output_tokens: int = 16  # content tokens when the request gives no max_tokens
    # Answers that end like a model's: a stop after a plausible length (a quarter of this to all of it,
    # drawn per prompt), cut at max_tokens only when the budget is smaller. 0: max_tokens of words.
    answer_tokens: int = 0
    # Play an agent's model: when the request offers a shell or command tool, call it with a harmless
    # command for this many rounds after the user's message, then answer. 0: the first offered tool is
    # called once, with arguments made from its schema.
    agent_tool_turns: int = 0
    reasoning_tokens: int = 8
    default_thinking: bool = False
    reasoning_field: str | None = None  # reasoning | reasoning_content | both; None = flavour default
    output_salt: str = ""
    empty_output_prompts: tuple[str, ...] = ()

    # prefix cache
    block_size: int | None = None  # None = flavour default (vllm 16, sglang 1)
    cache_blocks: int = 10_000_000
    cache_report: bool = True  # the engines report cached tokens only with a server flag; on by default

    # timing
    ttft_ms: float = 0.0
    prefill_tps: float = 0.0  # uncached prompt tokens per second, added to TTFT; 0 = free
    # One prefill compute shared by every request, in arrival order (an engine's GPU), instead of each
    # request prefilling at prefill_tps of its own: concurrent prefills then wait for each other.
    prefill_shared: bool = False
    decode_tps: float = 0.0  # tokens per second between chunks; 0 = as fast as possible

    # faults
    fail_rate: float = 0.0
    die_after_chunks: int | None = None
    error_after_chunks: int | None = None
    stall_before_first_byte_s: float = 0.0
    stall_after_chunks: int | None = None
    stall_s: float = 0.0
    max_images: int | None = None
    max_top_logprobs: int | None = None  # None = flavour default

    # KV-cache events as vLLM publishes them (kvevents.py; the cache's block_size must be >= 16). Ports on
    # the emulator's host; fixed at start-up (a config change does not move them).
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_topic: str = "kv"
    kv_events_host: str = "127.0.0.1"

    # bookkeeping
    recent_requests: int = 64  # request records kept for GET /emulator/stats

    # Resolved per-flavour values: the hot path reads these, never the None-able fields.
    @property
    def eff_reasoning_field(self) -> str:
        return self.reasoning_field or _FLAVOUR_DEFAULTS[self.flavour]["reasoning_field"]

    @property
    def eff_block_size(self) -> int:
        return self.block_size or _FLAVOUR_DEFAULTS[self.flavour]["block_size"]

    @property
    def eff_max_top_logprobs(self) -> int:
        if self.max_top_logprobs is not None:
            return self.max_top_logprobs
        return _FLAVOUR_DEFAULTS[self.flavour]["max_top_logprobs"]

    @property
    def eff_model_root(self) -> str:
        if self.model_root:
            return self.model_root
        if self.flavour == "sglang":
            return self.model  # SGLang reports the served name as root
        if self.model.startswith("deepseek-v4"):
            return "deepseek-ai/DeepSeek-V4-" + self.model.removeprefix("deepseek-v4-").title()
        return self.model

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["empty_output_prompts"] = list(self.empty_output_prompts)
        return out

    def merged(self, patch: dict[str, Any]) -> EmulatorConfig:
        """A copy with `patch` applied; unknown keys or bad values raise ValueError."""
        if not isinstance(patch, dict):
            raise ValueError("config patch must be a JSON object")
        changes = {name: _coerce(name, value) for name, value in patch.items()}
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        if self.flavour not in _FLAVOUR_DEFAULTS:
            raise ValueError(f"flavour must be vllm or sglang, not {self.flavour!r}")
        if self.tokenizer not in ("simple", "dsv41"):
            raise ValueError(f"tokenizer must be simple or dsv41, not {self.tokenizer!r}")
        if self.reasoning_field is not None and self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning_field must be one of {REASONING_FIELDS}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.cache_blocks < 0:
            raise ValueError("cache_blocks must be >= 0")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be within [0, 1]")
        for name in ("output_tokens", "reasoning_tokens", "max_model_len", "recent_requests", "answer_tokens",
                     "agent_tool_turns"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("ttft_ms", "prefill_tps", "decode_tps", "stall_before_first_byte_s", "stall_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


_FIELDS = {f.name: f for f in dataclasses.fields(EmulatorConfig)}
_HINTS = typing.get_type_hints(EmulatorConfig)


def knob_names() -> list[str]:
    return list(_FIELDS)


def knob_type(name: str) -> type:
    """The base Python type of a knob (int, float, str, bool, tuple), for CLI parsing."""
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and args:
        hint = args[0]
        origin = typing.get_origin(hint)
    if origin is Literal:
        return str
    if origin is tuple:
        return tuple
    return hint if isinstance(hint, type) else str


def _coerce(name: str, value: Any) -> Any:
    if name not in _FIELDS:
        raise ValueError(f"unknown emulator knob {name!r}")
    hint = _HINTS[name]
    nullable = type(None) in typing.get_args(hint)
    if value is None:
        if nullable:
            return None
        raise ValueError(f"{name} may not be null")
    kind = knob_type(name)
    try:
        if kind is bool:
            if isinstance(value, str):
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind is tuple:
            if isinstance(value, str):
                return (value,)
            return tuple(str(v) for v in value)
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {name}: {value!r}") from None


def default_field(name: str) -> Any:
    f = _FIELDS[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING  # every knob has a default
    return f.default_factory()


__all__ = ["EmulatorConfig", "Flavour", "knob_names", "knob_type", "default_field"]
