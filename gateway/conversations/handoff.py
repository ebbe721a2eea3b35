"""A large request body handed to the analysis worker through shared memory, not a pickle.

Each analysed turn's body (the JSON that was forwarded, 2 MB for a 1,600-message agent session)
must reach the worker process. It went pickled inside its Job, in a file written to /dev/shm per
job: the pickle copied the body into a growing buffer on the event loop and the write put it into
fresh tmpfs pages. Here the gateway keeps one file in its spool directory mapped (`BodyRing`),
copies the body into it as it is (bytes or the parts it was forwarded as: body_parts.py), and the
Job carries where it lies (`InRing`): one copy into pages already warm (bench/steps.py "analysis
hand-off"; bench/ab.py ring). The worker copies the bytes out when it runs the job (`take`),
off the event loop.

The ring is filled in order and freed as jobs are answered (in the order they were sent, mostly);
a body that does not fit (the ring is full of bodies waiting for a busy worker) goes the old way,
pickled. Its pages are reserved when it is created and stay in memory for the gateway's life
(GATEWAY_ANALYSIS_RING_MB, default 32; 0: off); no room for them leaves the ring off.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
from dataclasses import dataclass
from typing import Any

from ..pipeline.body_parts import Body, Parts

DEFAULT_RING_MB = 32
MIN_BYTES = 64 * 1024  # smaller bodies travel in the job's pickle (one batch on the pipe)


@dataclass(frozen=True, slots=True)
class InRing:
    """Where a job's body lies in the ring (what the Job carries to the worker instead of the body)."""

    path: str
    offset: int
    size: int


class _Slot:
    __slots__ = ("start", "end", "freed")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end, self.freed = start, end, False


class BodyRing:
    """The gateway's side: a mapped file, bodies copied in at consecutive offsets, wrapping around."""

    def __init__(self, directory: str, size: int) -> None:
        self.path = os.path.join(directory, "bodies")
        self.size = size
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Reserved now, not page by page as bodies are written: a full /dev/shm (64 MB in a
            # default Docker container) then refuses the ring here (the pickle way is used) instead
            # of killing the gateway with SIGBUS when a write first touches a page it cannot have.
            os.posix_fallocate(fd, 0, size)
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
        except OSError:
            os.unlink(self.path)  # ours (O_EXCL), refused its size
            raise
        finally:
            os.close(fd)
        self._live: collections.deque[_Slot] = collections.deque()  # oldest first
        self._slots: dict[int, _Slot] = {}  # by offset
        self.fallbacks = 0  # bodies that did not fit

    @classmethod
    def create(cls, directory: str | None, mb: float = DEFAULT_RING_MB) -> "BodyRing | None":
        """A ring in `directory` of `mb` MiB (Settings.analysis_ring_mb); None when off (0) or impossible."""
        if directory is None or mb <= 0:
            return None
        try:
            return cls(directory, int(mb * 2**20))
        except OSError:
            return None

    def put(self, body: Body) -> InRing | None:
        """The body copied into the ring; None: it does not fit now (or the ring is closed)."""
        n = len(body)
        mm = self._map
        at = self._place(n)
        if at < 0 or mm is None:
            self.fallbacks += 1
            return None
        if type(body) is Parts:
            pos = at
            for buf in body.buffers:
                k = len(buf)
                mm[pos:pos + k] = buf
                pos += k
        else:
            mm[at:at + n] = body
        slot = _Slot(at, at + n)
        self._live.append(slot)
        self._slots[at] = slot
        return InRing(self.path, at, n)

    def free(self, ref: InRing) -> None:
        slot = self._slots.pop(ref.offset, None)
        if slot is None:
            return
        slot.freed = True
        live = self._live
        while live and live[0].freed:
            live.popleft()

    def _place(self, n: int) -> int:
        live = self._live
        if not live:
            return 0 if n <= self.size else -1
        oldest, newest = live[0], live[-1]
        if newest.start >= oldest.start:  # not wrapped: free after the newest, then before the oldest
            if newest.end + n <= self.size:
                return newest.end
            return 0 if n <= oldest.start else -1
        return newest.end if newest.end + n <= oldest.start else -1  # wrapped: the gap between them

    @property
    def held(self) -> int:
        """Bytes between the oldest live body and the newest (what is not free to write)."""
        return sum(s.end - s.start for s in self._live if not s.freed)

    def close(self) -> None:
        mm, self._map = self._map, None
        if mm is not None:
            mm.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def pack(job_body: Any, ring: BodyRing | None) -> Any:
    """What the job carries: a large body's place in the ring, else the body with its parts joined
    (a memoryview does not pickle); a parsed body (not a JSON one) as it is."""
    kind = type(job_body)
    if kind is not bytes and kind is not Parts:
        return job_body
    if ring is not None and len(job_body) >= MIN_BYTES:
        ref = ring.put(job_body)
        if ref is not None:
            return ref
    return job_body if kind is bytes else bytes(job_body)


# -- in the worker process ---------------------------------------------------------------------------

_maps: dict[str, mmap.mmap] = {}


def take(ref: InRing) -> bytes:
    """The body's bytes, copied out of the ring (the gateway frees its place once the job is answered)."""
    mm = _maps.get(ref.path)
    if mm is None:
        fd = os.open(ref.path, os.O_RDONLY)
        try:
            mm = _maps[ref.path] = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
    return mm[ref.offset:ref.offset + ref.size]
