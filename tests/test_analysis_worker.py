"""The analysis worker's pipe (gateway/conversations/worker.py): answers larger than one read arrive
whole, and a burst of concurrent turns is analysed without a single false worker death."""

from __future__ import annotations

import asyncio
import pickle
import struct

import httpx

from gateway.conversations.worker import _take_frame
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway


def test_frames_are_taken_whole_however_the_pipe_cuts_them() -> None:
    payloads = [pickle.dumps(list(range(n))) for n in (0, 10, 40_000)]
    stream = b"".join(struct.pack("!i", len(p)) + p for p in payloads)
    stream += struct.pack("!i", -1) + struct.pack("!Q", 3) + b"abc"  # the >2 GiB form, small here
    for piece in (1, 7, 4096, len(stream)):
        buf, got = bytearray(), []
        for i in range(0, len(stream), piece):
            buf += stream[i:i + piece]
            while (frame := _take_frame(buf)) is not None:
                got.append(frame[0])
                del buf[:frame[1]]
        assert got == [*payloads, b"abc"] and not buf


def test_a_burst_of_concurrent_turns_is_analysed_by_one_living_worker() -> None:
    with run_emulator(flavour="vllm") as emu:
        lane = {"engine": "vllm", "replicas": [emu.url], "upstream_model": "deepseek-v4-flash",
                "qualification": "not_required", "render": {"template": "deepseek_v4.1"}}
        with run_gateway({"lanes": {"l": lane}, "models": {"m": "l"}}) as gw:

            async def burst() -> list[int]:
                async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                    async def one(i: int) -> int:
                        # Every eighth turn has a long history: its answer (the new state) is larger
                        # than what one read of the pipe gives.
                        history = [{"role": "user" if k % 2 else "assistant", "content": f"step {k} of {i}"}
                                   for k in range(1, 1500 if i % 8 == 0 else 2)]
                        body = {"model": "m", "max_tokens": 4, "messages": [
                            {"role": "system", "content": "You are agent %d. " % i + "Be brief. " * 400},
                            *history, {"role": "user", "content": f"Task {i}"}]}
                        return (await client.post("/v1/chat/completions", json=body)).status_code
                    return list(await asyncio.gather(*(one(i) for i in range(96))))

            assert asyncio.run(burst()) == [200] * 96
            overview = httpx.get(gw.url + "/admin/api/overview").json()["aftermath"]
            assert overview["analysis_worker_deaths"] == 0, overview
            assert overview["analysis_failures"] == 0, overview
            assert "worker process died" not in gw.log()
