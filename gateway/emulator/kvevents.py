"""The emulator's KV-cache events, published as vLLM publishes them (vllm/distributed/kv_events.py):
a PUB socket sending `(topic, seq, msgpack EventBatch)` and a ROUTER replay socket, so a demo lane
can use `kv_events` against emulated replicas exactly as against real ones.

Events come from the emulator's prefix cache (cache.py): a new block is a BlockStored (int hashes,
as vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), an evicted one a BlockRemoved, a reset an
AllBlocksCleared; one batch per cache operation. Only when the cache pages are the engine's blocks
(block_size >= 16): a finer cache (SGLang's per-token radix, block_size 1) publishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger("gateway.emulator")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventPublisher:
    def __init__(self, host: str, port: int, replay_port: int | None, topic: str = "kv",
                 buffer_steps: int = 10_000) -> None:
        self.topic = topic.encode()
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://{host}:{port}")
        self.router = None
        if replay_port:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://{host}:{replay_port}")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.router is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(0)
        if self.router is not None:
            self.router.close(0)
        self.ctx.term()

    def publish(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # PUB drops at its high-water mark, as the engine's does
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, buf in list(self.buffer):
                if seq >= first:
                    await self.router.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), buf))
            await self.router.send_multipart((client, b"", b"", END_SEQ, b""))


def stored(h: int, parent: int | None, tokens: list[int], block_size: int) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}
