"""One replica's KV-event stream: a ZMQ SUB socket, sequence checks, replay of gaps, restarts.

The receiving task only moves frames into a bounded queue; a second task decodes and applies them to
the replica's index, so a burst of events never holds up the event loop for long (each batch is
applied, then the task yields). Neither task is on a request's path: requests read the index, which
is plain dicts.

Sequence numbers are vLLM's (8-byte big-endian, from 0 per engine process):
* the next one: applied;
* a jump: the missing batches are asked from the replay socket (ROUTER; we send `start seq`, it
  answers `(topic, seq, payload)` frames, or `(seq, payload)` in older releases, then seq -1), applied
  in order, then the new one; what the replay buffer no longer has is counted as an unfilled gap;
* a smaller one: a new engine process (its counter restarted): the index is reset, cause restarted.

Either side may bind: vLLM binds its PUB socket when its endpoint has a `*` (the gateway connects) and
connects it otherwise (the gateway binds, `bind: true`). Connection state comes from the socket's
monitor (connected or accepted / disconnected), because an idle engine publishes nothing: silence is
not loss. While disconnected the stream is `lost` and the gateway's
verdicts fall back to today's count-based ones, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Callable

import xxhash
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .events import BadPayload, decode_events, unpack_batch
from .index import ReplicaIndex

log = logging.getLogger("gateway.kvevents")

END_SEQ = -1
QUEUE_BATCHES = 20_000  # frames waiting to be applied; past that they are dropped and replayed
REPLAY_TIMEOUT_S = 2.0
RETRY_S = 5.0
CATCH_UP = -2  # a queue item asking the apply task to replay the engine's buffer from its start
VERIFY = -3  # ... to check, after a reconnect, that the engine is the process we knew
APPLY_SLICE = 2_000  # events decoded and applied between two yields to the event loop


def _sequence(frame: bytes, allow_end: bool = False) -> int | None:
    """A batch number: 8 bytes, big-endian, never negative (but the replay's end marker)."""
    if len(frame) != 8:
        return None
    seq = int.from_bytes(frame, "big", signed=True)
    return seq if seq >= 0 or (allow_end and seq == END_SEQ) else None


class Subscriber:
    def __init__(self, replica: str, endpoint: str, replay: str | None, topic: str, index: ReplicaIndex,
                 ctx: zmq.asyncio.Context | None = None, clock: Callable[[], float] = time.time,
                 bind: bool = False) -> None:
        self.replica = replica
        self.endpoint = endpoint
        self.bind = bind
        self.replay_endpoint = replay
        self.topic = topic
        self.index = index
        # Held while a turn is judged against the index (KVEventsService.judge: a long prompt's on a
        # thread, the event loop free meanwhile): every change of the index waits for it.
        self.index_busy = asyncio.Lock()
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.clock = clock
        self.state = "connecting"  # connecting | live | lost | error | stopped
        self.since = clock()  # when the state last changed
        self.connected_once = False
        self.last_seq: int | None = None
        self.last_event_at: float | None = None
        self.batches = 0
        self.events = 0
        self.bad_payloads = 0  # messages that are not an EventBatch (or carry no valid sequence number)
        self.bad_events = 0  # malformed events inside a batch, skipped
        self.apply_errors = 0  # batches that could not be applied
        self.gaps = 0  # jumps in the sequence
        self.replayed = 0  # batches recovered through the replay socket
        self.unfilled = 0  # batches lost for good (replay unavailable or too short)
        self.restarts = 0  # sequence resets seen
        self.dropped = 0  # frames dropped because the apply queue was full
        self.disconnects = 0
        self.apply_s = 0.0  # time spent decoding and applying
        self.last_gap_at: float | None = None
        self.last_error: str | None = None
        self.missed_before_start = 0  # batches published before we subscribed that the replay no longer had
        self._caught_up = False
        self._was_lost = False  # disconnected since the last contact
        self._last_digest = 0  # of the last applied payload (to recognise the engine after a reconnect)
        self.caught_up = 0  # batches learnt from the replay buffer on first contact
        self._caught_up_at = 0.0  # receive times up to this were covered by the catch-up replay
        self._queue: asyncio.Queue[tuple[int, bytes, float]] = asyncio.Queue(QUEUE_BATCHES)
        self._tasks: list[asyncio.Task[None]] = []

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._receive(), name=f"kv-recv {self.replica}"),
                       loop.create_task(self._apply(), name=f"kv-apply {self.replica}")]

    async def stop(self) -> None:
        self._set("stopped")
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass
        self._tasks = []

    def _set(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.since = self.clock()
            log.log(logging.WARNING if state == "lost" else logging.INFO,
                    "kv events of %s: %s (%s)", self.replica, state, self.endpoint)

    @property
    def healthy(self) -> bool:
        return self.state == "live"

    # -- receiving -------------------------------------------------------------------------------

    async def _receive(self) -> None:
        """Receive until stopped; a socket error (e.g. the address to bind is taken) is shown as state
        `error` and retried every few seconds."""
        while True:
            try:
                await self._receive_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - shown, counted, retried
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._set("error")
                await asyncio.sleep(RETRY_S)

    async def _receive_once(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.RECONNECT_IVL, 200)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        if self.bind:
            sub.bind(self.endpoint)
        else:
            sub.connect(self.endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    self._monitor(await monitor.recv_multipart())
                if sub in ready:
                    frames = await sub.recv_multipart()
                    if len(frames) < 3:
                        self.bad_payloads += 1
                        continue
                    if self.state != "live":  # a message proves the link even before the monitor says so
                        self._contact()
                    seq = _sequence(frames[-2])
                    if seq is None:  # not a batch number: never applied, never a gap to replay
                        self.bad_payloads += 1
                        continue
                    try:
                        self._queue.put_nowait((seq, frames[-1], self.clock()))
                    except asyncio.QueueFull:
                        self.dropped += 1  # the next applied batch sees the jump and replays
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _monitor(self, frames: list[bytes]) -> None:
        try:
            event = parse_monitor_message(frames)["event"]
        except Exception:  # noqa: BLE001 - a malformed monitor frame changes nothing
            return
        if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
            self._contact()
        elif event == zmq.EVENT_DISCONNECTED:
            self.disconnects += 1
            self._was_lost = True
            self._set("lost")

    def _contact(self) -> None:
        """The link is up (the monitor said so, or a message came first)."""
        marker = None
        if self.replay_endpoint is not None:
            if self.last_seq is None and self.batches == 0 and not self._caught_up:
                # First contact: learn what the pool already holds from the engine's replay buffer, now,
                # before any request of ours runs (an idle engine publishes nothing to trigger it later).
                self._caught_up = True
                marker = CATCH_UP
            elif self.last_seq is not None and self._was_lost:
                # Back after a disconnect: the same engine process, or a new one whose sequence may already
                # have passed ours? The replay buffer tells: it still has our last batch only if it is the same.
                marker = VERIFY
        self._was_lost = False
        if marker is not None:
            try:
                self._queue.put_nowait((marker, b"", self.clock()))
            except asyncio.QueueFull:
                pass  # far behind already: the sequence checks still apply
        self.connected_once = True
        self._set("live")

    # -- applying --------------------------------------------------------------------------------

    async def _apply(self) -> None:
        """Apply batches in order until stopped. Nothing a publisher sends ends this loop: a batch that
        cannot be applied is counted, logged and skipped, and the state says so."""
        while True:
            seq, payload, t = await self._queue.get()
            try:
                await self._apply_next(seq, payload, t)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - counted and shown; the next batch is applied
                self.apply_errors += 1
                self.last_error = f"seq {seq}: {type(exc).__name__}: {exc}"[:300]
                log.exception("kv events of %s: batch %d could not be applied, skipped", self.replica, seq)
            await asyncio.sleep(0)  # let requests run between batches

    async def _apply_next(self, seq: int, payload: bytes, t: float) -> None:
        if seq == CATCH_UP:
            await self._catch_up()
            return
        if seq == VERIFY:
            await self._verify()
            return
        last = self.last_seq
        if last is None and seq > 0 and self.batches == 0:
            # The first batch came before the connect event: catch up to it from the replay buffer.
            await self._fill(0, seq, catch_up=True)
        elif last is not None:
            if seq == last or (seq < last and t <= self._caught_up_at):
                return  # a duplicate (also received live while the catch-up replayed it)
            if seq < last:
                # vLLM numbers batches from 0 in each engine process: a smaller number is a new process.
                self.restarts += 1
                log.warning("kv events of %s: sequence went from %d to %d: engine restarted, index reset",
                            self.replica, last, seq)
                async with self.index_busy:
                    self.index.reset("restarted", t)
            elif seq > last + 1:
                self.gaps += 1
                await self._fill(last + 1, seq)
        await self._apply_one(seq, payload, t)

    async def _apply_one(self, seq: int, payload: bytes, t: float) -> None:
        t0 = time.perf_counter()
        try:
            ts, raw_events = unpack_batch(payload)
        except BadPayload as exc:
            self.bad_payloads += 1
            log.warning("kv events of %s: seq %d: %s", self.replica, seq, exc)
        else:
            # A huge batch is decoded and applied in slices, the loop free between them.
            for start in range(0, len(raw_events), APPLY_SLICE):
                if start:
                    self.apply_s += time.perf_counter() - t0
                    await asyncio.sleep(0)
                    t0 = time.perf_counter()
                batch = decode_events(ts, raw_events[start:start + APPLY_SLICE])
                async with self.index_busy:
                    self.index.apply(batch, t)
                self.events += len(batch.events)
                if batch.bad:
                    self.bad_events += batch.bad
                    log.warning("kv events of %s: seq %d: %d malformed event(s) skipped", self.replica, seq,
                                batch.bad)
            self.batches += 1
        self.last_seq = seq
        self._last_digest = xxhash.xxh3_64_intdigest(payload)
        self.last_event_at = t
        self.apply_s += time.perf_counter() - t0

    async def _fill(self, start: int, stop: int, catch_up: bool = False) -> None:
        """Batches start..stop-1 from the replay socket, applied in order; what it lacks is counted."""
        got = start
        if self.replay_endpoint is not None:
            try:
                async with contextlib.aclosing(self._replayed(start)) as replayed:
                    async for seq, payload in replayed:
                        if seq < got or seq >= stop:
                            continue
                        if seq > got:
                            if not catch_up:
                                break  # the buffer starts later than we need: the rest is lost
                            self.missed_before_start += seq - got  # older than the buffer: never ours
                            got = seq
                        await self._apply_one(seq, payload, self.clock())
                        self.replayed += 1
                        got = seq + 1
            except (zmq.ZMQError, asyncio.TimeoutError, OSError) as exc:
                log.warning("kv events of %s: replay from %d failed: %s", self.replica, start, exc)
        if got < stop and catch_up:
            self.missed_before_start += stop - got
        elif got < stop:
            self.unfilled += stop - got
            self.last_gap_at = self.clock()
            log.warning("kv events of %s: batches %d..%d lost (replay %s)", self.replica, got, stop - 1,
                        "unavailable" if self.replay_endpoint is None else "did not have them")

    async def _verify(self) -> None:
        last, expected = self.last_seq, self._last_digest
        if last is None:
            return
        try:
            first = None
            async with contextlib.aclosing(self._replayed(last)) as replayed:
                async for seq, payload in replayed:
                    if first is None:
                        first = (seq, xxhash.xxh3_64_intdigest(payload))
                        if first != (last, expected):
                            break
                    elif seq > (self.last_seq or 0):
                        await self._apply_one(seq, payload, self.clock())  # what we missed while away
                        self.replayed += 1
        except (zmq.ZMQError, asyncio.TimeoutError, OSError) as exc:
            log.info("kv events of %s: cannot verify the engine after reconnecting: %s", self.replica, exc)
            return
        if first != (last, expected):
            self.restarts += 1
            log.warning("kv events of %s: the engine's replay buffer no longer has batch %d as we saw it (%s): "
                        "a new engine process; index reset", self.replica, last,
                        "missing" if first is None else f"seq {first[0]}")
            async with self.index_busy:
                self.index.reset("restarted", self.clock())
            self.last_seq = None
            await self._catch_up()
        self._caught_up_at = self.clock()

    async def _catch_up(self) -> None:
        """Everything the engine's replay buffer holds, applied in order (blocks stored before we came)."""
        try:
            async with contextlib.aclosing(self._replayed(0)) as replayed:
                async for seq, payload in replayed:
                    if self.last_seq is not None and seq <= self.last_seq:
                        continue
                    expected = 0 if self.last_seq is None else self.last_seq + 1
                    if seq > expected:
                        self.missed_before_start += seq - expected  # older than the buffer
                    await self._apply_one(seq, payload, self.clock())
                    self.caught_up += 1
        except (zmq.ZMQError, asyncio.TimeoutError, OSError) as exc:
            log.info("kv events of %s: no catch-up from the replay socket: %s", self.replica, exc)
        self._caught_up_at = self.clock()

    async def _replayed(self, start: int):
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)  # type: ignore[arg-type]
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(REPLAY_TIMEOUT_S * 1000):
                    raise asyncio.TimeoutError(f"no answer within {REPLAY_TIMEOUT_S}s")
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) < 2:
                    return
                seq = _sequence(frames[-2], allow_end=True)
                if seq is None or seq == END_SEQ:
                    return
                yield seq, frames[-1]
        finally:
            sock.close(0)

    def snapshot(self) -> dict[str, object]:
        return {"endpoint": self.endpoint, "bind": self.bind, "replay": self.replay_endpoint, "topic": self.topic,
                "state": self.state, "since": self.since, "last_seq": self.last_seq,
                "last_event_at": self.last_event_at, "batches": self.batches, "events": self.events,
                "gaps": self.gaps, "replayed": self.replayed, "unfilled": self.unfilled, "restarts": self.restarts,
                "dropped": self.dropped, "bad_payloads": self.bad_payloads,
                "bad_events": self.bad_events, "apply_errors": self.apply_errors, "disconnects": self.disconnects,
                "last_gap_at": self.last_gap_at, "queued": self._queue.qsize(), "last_error": self.last_error,
                "missed_before_start": self.missed_before_start, "caught_up": self.caught_up,
                "apply_ms_per_batch": round(self.apply_s * 1000 / self.batches, 3) if self.batches else None}
