"""routes.yaml as the tests write it: lanes, and the routes around them, all from one base lane.

    run_gateway(routes({"a": lane(emu.url), "b": lane(other.url, engine="sglang")}, {"public": "a"}))
    run_gateway(agent_routes(emu.url))   # the conversation tests' lane "ds", public name "ds"

A test file whose lanes need other knobs (timeouts, limits, a breaker) passes them to `lane`, or keeps
a small builder of its own on top of it; it never writes a lane from scratch.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.core.config import Lane

UPSTREAM_MODEL = "deepseek-v4-flash"  # the emulator's default served model
# The conversation tests' render: DeepSeek-V4.1's template, its effort words as the numbers it takes.
AGENT_RENDER = {"template": "deepseek_v4.1", "effort_map": {"low": 25, "high": 50, "xhigh": 75, "max": 100}}


def lane(replicas: str | list[str], **extra: Any) -> dict[str, Any]:
    """A vLLM lane on `replicas` (one URL or several) for the emulator's model, serving at once (no
    qualification run); `extra` adds or replaces top-level keys."""
    return {"engine": "vllm", "replicas": [replicas] if isinstance(replicas, str) else list(replicas),
            "upstream_model": UPSTREAM_MODEL, "qualification": "not_required", **extra}


def routes(lanes: dict[str, dict[str, Any]], models: dict[str, str] | None = None,
           **gateway: Any) -> dict[str, Any]:
    """A routes.yaml: `lanes`; `models` maps public names to lanes (by default each lane under its own
    name); `gateway`, when given, is the gateway section."""
    out: dict[str, Any] = {"gateway": gateway} if gateway else {}
    out["lanes"] = lanes
    out["models"] = {name: name for name in lanes} if models is None else models
    return out


def emulator_lane(replicas: str | list[str], **extra: Any) -> dict[str, Any]:
    """A lane on a vLLM-flavoured emulator whose cache predictions come in its 16-token blocks (a vLLM
    lane's default too; said here so that a test reads it)."""
    return lane(replicas, **{"cache": {"block_size": 16}, **extra})


def agent_lane(replicas: str | list[str], **extra: Any) -> dict[str, Any]:
    """The conversation tests' lane: an emulator lane rendered with DeepSeek-V4.1's template
    (the emulator: tests/support/emulator_proc.AGENT_EMULATOR)."""
    return emulator_lane(replicas, **{"render": copy.deepcopy(AGENT_RENDER), **extra})


def agent_routes(replicas: str | list[str], **extra: Any) -> dict[str, Any]:
    """One agent lane "ds", public name "ds"."""
    return routes({"ds": agent_lane(replicas, **extra)})


def kv_lane(replicas: str | list[str], kv_replicas: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """An emulator lane that knows its replicas' caches from their KV events (`kv_replicas`: replica URL ->
    its kv_events entry), rendered without thinking as the KV_EMULATOR answers."""
    return emulator_lane(replicas, **{"render": {"template": "deepseek_v4.1", "thinking": False},
                                      "kv_events": {"replicas": kv_replicas}, **extra})


def lane_config(**fields: Any) -> Lane:
    """A lane's parsed configuration, for a test without servers: model "m" on a replica nobody
    listens on, and `fields` as routes.yaml states them (qualification is the lane's default)."""
    return Lane.model_validate({"replicas": ["http://127.0.0.1:1"], "upstream_model": "m", **fields})
