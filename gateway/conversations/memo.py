"""What the analysis of a conversation's last turn leaves for its next one, in the analysing process.

An append-only turn of a long agent session repeats megabytes of history; analysing it from scratch
(parse, normalise, digest, plan, look up every rendered item, fingerprint every message) repeats
what the previous turn did. With the previous turn's memo the unchanged history is recognised
from its bytes (rawbody.py) and its parse, render (Renderer.render_turn's `previous`) and message
fingerprints are taken as they were: only what is new is parsed, rendered and tokenised.

Nothing here changes a result: every reused value is what the full path computes from the same
bytes; a missing memo (evicted, a new worker process) only costs time. Bounded in conversations and
in bytes (GATEWAY_ANALYSIS_MEMO_BYTES): a memo keeps its turn's parsed messages (several times the
body's bytes) and its render's items alive even after the render cache has let them go.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..render.result import Previous, Rendered
from .rawbody import BodyPrint
from .render_check import Checked
from .state import ConversationState, MessagePrints

DEFAULT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_CONVERSATIONS = 512  # the soak runs 400 agents side by side
PARSED_PER_BODY_BYTE = 3  # parsed messages against their JSON (the agent corpus's, rounded up)


@dataclass
class TurnMemo:
    body_print: BodyPrint
    messages: list[dict[str, Any]]  # the request's messages, as parsed
    previous: Previous | None  # its render
    prints: MessagePrints  # its messages' fingerprints (engine below)
    engine: str
    data: bytes  # the state stored after this turn
    state: ConversationState  # the same, decoded
    cost: int
    estimated: Rendered | None = None  # on a lane without a template: its estimate (render/estimate.py)
    checked: Checked | None = None  # its prompt ids found equal to its render (render_check.py)
    kv_keys: bytes | None = None  # its blocks' keys (analysis._block_keys)


class Memos:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        self.max_bytes = max_bytes
        self.max_conversations = max_conversations
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[str, TurnMemo] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def take(self, cid: str) -> TurnMemo | None:
        """The conversation's memo, removed (a turn that fails leaves none: the next one starts afresh)."""
        with self._lock:
            memo = self._data.pop(cid, None)
            if memo is None:
                self.misses += 1
                return None
            self.bytes -= memo.cost
            self.hits += 1
            return memo

    def put(self, cid: str, memo: TurnMemo) -> None:
        if memo.cost > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(cid, None)
            if old is not None:
                self.bytes -= old.cost
            self._data[cid] = memo
            self.bytes += memo.cost
            while self._data and (self.bytes > self.max_bytes or len(self._data) > self.max_conversations):
                _, gone = self._data.popitem(last=False)
                self.bytes -= gone.cost

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = self.hits = self.misses = 0


def cost(body_bytes: int, previous: Previous | None, body_print: BodyPrint, estimated: Rendered | None = None,
         kv_keys: bytes | None = None) -> int:
    kept = (previous.nbytes() if previous else 0) + (len(kv_keys) if kv_keys else 0)
    if estimated is not None:  # its segments' texts and ids (the token cache may drop its own copies)
        kept += sum(2 * len(s.text) + 4 * len(s.token_ids) + 200 for s in estimated.segments)
    return PARSED_PER_BODY_BYTE * body_bytes + body_print.nbytes() + kept + 1024


_memos: Memos | None = None
# Settings.analysis_memo_bytes (GATEWAY_ANALYSIS_MEMO_BYTES), set as the process starts (process_switches.py).
MAX_BYTES = DEFAULT_MAX_BYTES


def memos() -> Memos:
    """The process's memos (the analysis worker's, or the gateway's in thread mode)."""
    global _memos
    if _memos is None:
        _memos = Memos(MAX_BYTES)
    return _memos
