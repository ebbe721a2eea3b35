"""A replica's KV pool size, in tokens, from the engine itself when the lane config does not say.

vLLM: `/metrics` has `vllm:cache_config_info{...,block_size="32",num_gpu_blocks="128",...} 1.0`; one of
those blocks is vLLM's null block, never cached, so the pool holds (num_gpu_blocks - 1) x block_size.
SGLang: `sglang:max_total_num_tokens` (a gauge of the token pool).
"""

from __future__ import annotations

import re

import httpx

_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_pool_tokens(metrics_text: str) -> int | None:
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(_LABEL.findall(line.split("{", 1)[1].rsplit("}", 1)[0]))
            try:
                blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
            except (KeyError, ValueError):
                continue
            return max(0, blocks - 1) * size
        if line.startswith("sglang:max_total_num_tokens"):
            try:
                return int(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                continue
    return None


async def fetch_pool_tokens(replica_url: str, api_key: str | None = None, timeout: float = 5.0) -> int | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            resp = await client.get(replica_url + "/metrics", headers=headers)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return parse_pool_tokens(resp.text)
