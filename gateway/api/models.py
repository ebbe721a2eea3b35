"""GET /v1/models and /v1/models/{id}: what clients (llama-benchy, Open WebUI, aider) read limits from.

Each public model is described the way vLLM describes its own (`id, object, created, owned_by,
root, parent, max_model_len`) plus a `gateway` extension: the lane, its engine, the upstream
model, the fallbacks and the lane's qualification state.

- `root`: the upstream model as the engine names it (vLLM: the model path, e.g.
  `deepseek-ai/DeepSeek-V4-Flash`, which tokenizer detection reads); the lane's `upstream_model`
  until an engine has answered.
- `max_model_len`: the lane's `limits.max_context_tokens`, else the engine's own `/v1/models`
  (asked once a minute per lane, 2 s timeout, never on the hot path of a generation); left out
  when neither is known.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..core.errors import GatewayError
from ..core.runtime import LaneRuntime, Runtime

log = logging.getLogger("gateway.models")

ENGINE_INFO_TTL_S = 60.0
ENGINE_INFO_RETRY_S = 10.0  # after a failed ask
ENGINE_TIMEOUT_S = 2.0


@dataclass
class EngineInfo:
    root: str | None
    max_model_len: int | None
    at: float
    ok: bool


class ModelCatalog:
    def __init__(self, runtime: Runtime, created: float) -> None:
        self.runtime = runtime
        self.created = int(created)
        self._info: dict[tuple, EngineInfo] = {}
        self._asking: dict[tuple, asyncio.Task[EngineInfo]] = {}

    async def list(self) -> dict[str, Any]:
        snap = self.runtime.snapshot
        lanes = {snap.config.models[m] for m in snap.config.models}
        await asyncio.gather(*(self._engine_info(snap.lanes[name]) for name in lanes))
        return {"object": "list", "data": [self._entry(m) for m in snap.config.models]}

    async def one(self, model: str) -> dict[str, Any]:
        snap = self.runtime.snapshot
        lane = snap.resolve(model)
        if lane is None:
            raise GatewayError(404, f"The model '{model[:200]}' does not exist", param="model", code="model_not_found")
        await self._engine_info(lane)
        return self._entry(model)

    def _entry(self, model: str) -> dict[str, Any]:
        snap = self.runtime.snapshot
        config = snap.config
        lane = snap.lanes[config.models[model]]
        info = self._info.get(_key(lane))
        entry: dict[str, Any] = {
            "id": model, "object": "model", "created": self.created,
            "owned_by": config.owned_by.get(model, "gateway"),
            "root": (info.root if info and info.root else None) or lane.config.upstream_model,
            "parent": None,
        }
        limit = lane.config.limits.max_context_tokens or (info.max_model_len if info else None)
        if limit:
            entry["max_model_len"] = limit
        q = lane.qualification or {}
        entry["gateway"] = {
            "lane": lane.name, "engine": lane.config.engine, "upstream_model": lane.config.upstream_model,
            "fallbacks": list(config.fallbacks.get(model, ())),
            "qualification": {"state": q.get("state", "unknown"), "reason": q.get("reason")},
        }
        return entry

    async def _engine_info(self, lane: LaneRuntime) -> None:
        key = _key(lane)
        now = time.monotonic()
        info = self._info.get(key)
        if info is not None and now - info.at < (ENGINE_INFO_TTL_S if info.ok else ENGINE_INFO_RETRY_S):
            return
        task = self._asking.get(key)
        if task is None:  # one question per lane at a time, whoever asks
            task = self._asking[key] = asyncio.ensure_future(_ask(lane))
            task.add_done_callback(functools.partial(self._answered, key))
        if info is not None:
            return  # stale while it refreshes: only the very first list waits for the engine
        try:
            await asyncio.shield(task)
        except Exception:  # noqa: BLE001 - the list is still answered from what the config says
            pass

    def _answered(self, key: tuple, task: "asyncio.Task[EngineInfo]") -> None:
        self._asking.pop(key, None)
        got = None if task.cancelled() or task.exception() is not None else task.result()
        if got is None or not got.ok:  # no answer now: keep what an engine said before, ask again sooner
            prev = self._info.get(key)
            got = EngineInfo(prev.root if prev else None, prev.max_model_len if prev else None,
                             time.monotonic(), False)
        self._info[key] = got


def _key(lane: LaneRuntime) -> tuple:
    return (lane.name, tuple(lane.config.replicas), lane.config.upstream_model)


async def _ask(lane: LaneRuntime) -> EngineInfo:
    """GET /v1/models on the lane's replicas (first that answers); pick the lane's upstream model."""
    up = lane.upstream
    headers = {"Authorization": f"Bearer {up.api_key}"} if up.api_key else {}
    now = time.monotonic()
    for rep in sorted(up.replicas, key=lambda r: not r.available(now)):
        try:
            async with asyncio.timeout(ENGINE_TIMEOUT_S):
                async with up.session().get(rep.url + "/v1/models", headers=headers) as resp:
                    if resp.status != 200:
                        continue
                    body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            continue
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data:
            continue
        want = lane.config.upstream_model
        item = next((d for d in data if isinstance(d, dict) and d.get("id") == want), data[0])
        if not isinstance(item, dict):
            continue
        root = item.get("root") if isinstance(item.get("root"), str) else None
        mml = item.get("max_model_len")
        return EngineInfo(root, mml if type(mml) is int and mml > 0 else None, time.monotonic(), True)
    return EngineInfo(None, None, time.monotonic(), False)
