"""Tracing as a gateway service: its buffered spans are exported when the gateway stops."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .base import Tracing


@dataclass
class TracingService:
    tracing: Tracing

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self.tracing.enabled:
            await asyncio.to_thread(self.tracing.shutdown)  # flushes the batch over HTTP: off the loop
