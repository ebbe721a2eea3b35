"""The analysis worker's pipe (gateway/conversations/worker.py): answers larger than one read arrive
whole, and a burst of concurrent turns is analysed without a single false worker death."""

from __future__ import annotations

import asyncio
import pickle
import struct
from pathlib import Path

import httpx
import orjson

from gateway.conversations.job import Job
from gateway.conversations.state import ConversationState
from gateway.conversations.worker import BEHIND_JOBS, IN_FLIGHT, AnalysisProcess, _take_frame
from gateway.conversations.worker_main import NICENESS
from gateway.render.result import RenderOptions
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes


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
        with run_gateway(routes({"l": lane(emu.url, render={"template": "deepseek_v4.1"})}, {"m": "l"})) as gw:

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


def _job(i: int, options: RenderOptions) -> Job:
    body = {"model": "m", "messages": [{"role": "user", "content": f"task {i}"}]}
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    return Job(f"r{i}", "l", options, options, 16, "vllm", 5000.0, orjson.dumps(body),
               {"role": "assistant", "content": f"done {i}"}, "stop", usage, False, None, None, None, False,
               False, ConversationState(f"c{i}", "key"))


def test_batches_wait_in_the_pipe_while_the_worker_is_busy() -> None:
    """A job that comes while a batch is in the worker's hands is sent at once (up to IN_FLIGHT
    batches), not when the answer has been read: a busy event loop read answers late, and the worker
    sat idle meanwhile. Answers come back to their own jobs, in order."""
    options = RenderOptions(thinking=False, engine="vllm")

    def job(i: int) -> Job:
        return _job(i, options)

    async def main() -> None:
        process = AnalysisProcess()
        process.start([options])  # the worker loads the tokenizer and template before its first answer
        try:
            first = asyncio.ensure_future(process.run(job(0)))
            for _ in range(2):
                await asyncio.sleep(0)  # two turns of the loop, the scenario: the job is sent, not yet answered
            assert process.batches == 1 and not first.done()
            rest = [asyncio.ensure_future(process.run(job(i))) for i in range(1, IN_FLIGHT + 2)]
            for _ in range(2):
                await asyncio.sleep(0)  # two turns of the loop, the scenario: sent at once, not after an answer
            assert process.batches == 2 and not first.done(), "sent while the first is unanswered"
            outcomes = await asyncio.wait_for(asyncio.gather(first, *rest), 60)
            assert [o.cache.rendered_prompt_tokens > 0 for o in outcomes] == [True] * len(outcomes)
            assert [orjson.loads(o.data)["id"] for o in outcomes] == [f"c{i}" for i in range(IN_FLIGHT + 2)]
        finally:
            process.stop()

    asyncio.run(main())


def test_batches_run_politely_unless_analysis_is_behind() -> None:
    """A batch sent with BEHIND_JOBS or more turns in the worker's hands runs at the event loop's
    priority, in a thread of its own; the others in the worker's main thread, at NICENESS (Linux:
    niceness is per thread)."""
    options = RenderOptions(thinking=False, engine="vllm")

    async def main() -> tuple[int, int, set[int]]:
        process = AnalysisProcess()
        process.start([options])
        try:
            await process.run(_job(0, options))  # alone: polite
            many = await asyncio.gather(*(process.run(_job(i, options)) for i in range(1, BEHIND_JOBS + 1)))
            assert len(many) == BEHIND_JOBS
            pid = process.pid()
            nices = {int(stat.read_text().rsplit(")", 1)[1].split()[16])
                     for stat in Path(f"/proc/{pid}/task").glob("*/stat")}  # noqa: ASYNC240 - /proc, in memory
            return process.batches, process.behind_batches, nices
        finally:
            process.stop()

    batches, behind, nices = asyncio.run(main())
    assert batches == 2 and behind == 1, "the lone job polite, the burst of BEHIND_JOBS behind"
    assert {0, NICENESS} <= nices, nices


def test_the_spool_directory_exists_only_while_the_worker_can_use_it(tmp_path: Path) -> None:
    """Built and never started (`gateway check`, a composition dropped), it leaves nothing behind;
    started, it has its private directory (large jobs, the body ring); stopped, the directory is gone."""
    process = AnalysisProcess(str(tmp_path))
    assert list(tmp_path.iterdir()) == []

    async def main() -> None:
        process.start([])
        try:
            listed = tmp_path.iterdir()  # noqa: ASYNC240 - a test's directory, listed while the worker runs
            assert [p.name.startswith("gateway-analysis-") for p in listed] == [True]
        finally:
            process.stop()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []
