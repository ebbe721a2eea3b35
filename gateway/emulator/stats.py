"""What the emulator saw: counters, recent requests (with headers), and client cancellations."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

_BODY_KEEP_BYTES = 256 * 1024  # bodies above this are recorded by size only (agent bodies reach MBs)


class RequestRecord:
    __slots__ = (
        "request_id", "path", "received_at", "headers", "body", "body_bytes", "model", "stream", "status",
        "stage", "chunks_sent", "prompt_tokens", "cached_tokens", "completion_tokens", "t0", "died", "done",
    )

    def __init__(self, request_id: str, path: str, headers: dict[str, str], body: Any, body_bytes: int) -> None:
        self.request_id = request_id
        self.path = path
        self.received_at = time.time()
        self.t0 = time.monotonic()
        self.headers = headers
        self.body = body if body_bytes <= _BODY_KEEP_BYTES else None
        self.body_bytes = body_bytes
        self.model = body.get("model") if isinstance(body, dict) else None
        self.stream = bool(body.get("stream")) if isinstance(body, dict) else False
        self.status = 200
        self.stage = "received"
        self.chunks_sent = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.died = False  # the emulator itself cut the connection (die_after_chunks)
        self.done = False

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "path": self.path, "received_at": self.received_at,
            "headers": self.headers, "model": self.model, "stream": self.stream, "status": self.status,
            "stage": self.stage, "chunks_sent": self.chunks_sent, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "completion_tokens": self.completion_tokens,
            "body_bytes": self.body_bytes, "body": self.body, "done": self.done,
        }


class Stats:
    def __init__(self, keep: int = 64) -> None:
        self.reset(keep)

    def reset(self, keep: int | None = None) -> None:
        keep = keep if keep is not None else self.recent.maxlen or 64
        self.requests = 0
        self.completed = 0
        self.errors: dict[str, int] = {}
        self.active = 0
        self.cancelled: deque[dict[str, Any]] = deque(maxlen=1000)  # newest kept; the count is exact
        self.cancelled_count = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.recent: deque[RequestRecord] = deque(maxlen=keep)

    def begin(self, rec: RequestRecord) -> None:
        self.requests += 1
        self.active += 1
        self.recent.append(rec)

    def end(self, rec: RequestRecord) -> None:
        self.active -= 1
        if rec.status == 200 and not rec.died and rec.done:
            self.completed += 1

    def error(self, rec: RequestRecord, kind: str, status: int) -> None:
        rec.status = status
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def cancel(self, rec: RequestRecord) -> None:
        if rec.died:
            return  # our own fault injection, not a client leaving
        self.cancelled_count += 1
        self.cancelled.append(
            {
                "request_id": rec.request_id, "at": time.time(), "elapsed_s": time.monotonic() - rec.t0,
                "stage": rec.stage, "chunks_sent": rec.chunks_sent, "path": rec.path,
            }
        )
        rec.stage = "cancelled"

    def to_json(self, cache: dict[str, Any]) -> dict[str, Any]:
        recent = [r.to_json() for r in self.recent]
        return {
            "requests": self.requests,
            "completed": self.completed,
            "active": self.active,
            "errors": self.errors,
            "cancelled_count": self.cancelled_count,
            "cancelled": list(self.cancelled),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "evictions": cache["evictions"],
            "cache": cache,
            "last_headers": recent[-1]["headers"] if recent else None,
            "recent": recent,
        }
