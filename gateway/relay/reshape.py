"""One shape for every lane, rewritten on the relayed bytes: the client's model name, one reasoning field.

- `"model"` becomes the public name the client asked for (engines answer with their served name,
  e.g. `deepseek-v4-flash` or a model path), in every chunk, the usage chunk and whole bodies.
- `reasoning_field` (per lane, optional): `reasoning` (vLLM >= 0.10), `reasoning_content`
  (SGLang, DeepSeek's API) or `both`, so clients of several lanes see one shape.
- ids get OpenAI's prefix (`chatcmpl-`, `cmpl-`): SGLang sends a bare hex id.
- SGLang's top-level `usage.reasoning_tokens` is also given where OpenAI clients read it,
  `usage.completion_tokens_details.reasoning_tokens`.

Byte-level on purpose: a key followed by a JSON string cannot occur inside another string
(its quotes would be escaped), so finding `"model":` and the end of its string value is exact, and
costs a fraction of an orjson loads+dumps of the chunk (tests/test_reshape.py::test_cost_per_chunk).
Only the once-per-request usage chunk is parsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import orjson

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.runtime import LaneRuntime

ReasoningField = Literal["reasoning", "reasoning_content", "both"]

_MODEL = b'"model":'
_REASONING = b'"reasoning":'
_REASONING_CONTENT = b'"reasoning_content":'
_ID = b'"id":"'
_DETAILS = b'"completion_tokens_details":{'
_SAME = b"="  # a learnt head that needs no rewriting (compared by identity)


def _value_end(data: bytes, start: int) -> int:
    """Index just past the JSON value (a string or a bare word: null, true, a number) at `start`."""
    n = len(data)
    while start < n and data[start] in b" \t":
        start += 1
    if start < n and data[start] == 0x22:  # '"'
        pos = start + 1
        while True:
            q = data.find(b'"', pos)
            if q < 0:
                return -1
            back = q - 1
            while data[back] == 0x5C:  # '\\'
                back -= 1
            if (q - 1 - back) % 2 == 0:  # an even run of backslashes: the quote is not escaped
                return q + 1
            pos = q + 1
    pos = start
    while pos < n and data[pos] not in b",}] \t\r\n":
        pos += 1
    return pos


def _string_end(data: bytes, start: int) -> int:
    """Index just past the JSON string at `start` (after blanks); -1 when the value is not a string
    (a tool schema's `"model": {...}` property is not a model name)."""
    n = len(data)
    while start < n and data[start] in b" \t":
        start += 1
    if start < n and data[start] == 0x22:
        return _value_end(data, start)
    return -1


def _replace_values(data: bytes, key: bytes, value: bytes) -> bytes:
    """Every `key` (e.g. b'"model":') whose value is a string gets `value` (JSON bytes) instead."""
    out: list[bytes] = []
    pos = look = 0  # copied up to `pos`; searching from `look`
    while True:
        k = data.find(key, look)
        if k < 0:
            break
        start = look = k + len(key)
        end = _string_end(data, start)
        if end < 0:
            continue
        out.append(data[pos:start])
        out.append(value)
        pos = look = end
    if not out:
        return data
    out.append(data[pos:])
    return b"".join(out)


def _duplicate(data: bytes, key: bytes, other: bytes) -> bytes:
    """After each `key: value` insert `,other: value` (for reasoning_field: both)."""
    out: list[bytes] = []
    pos = 0
    while True:
        k = data.find(key, pos)
        if k < 0:
            break
        start = k + len(key)
        end = _value_end(data, start)
        if end < 0:
            break
        out.append(data[pos:end])
        out.append(b"," + other + data[start:end].lstrip())
        pos = end
    if not out:
        return data
    out.append(data[pos:])
    return b"".join(out)


class Reshaper:
    """Rewrites one exchange's response bytes; `event` per SSE event, `body` for a whole answer.

    What an engine sends is the same in every chunk of a stream, so the rewrites are learnt once:
    the chunk head (`{"id":"X","object":...,"model":"M"`) as an (old, new) pair, and which
    reasoning key the engine uses. A later chunk that starts with the old head then costs one
    `startswith` and one concatenation and, when the reasoning key is renamed, one `replace`: C
    speed, no parsing. The head is rewritten only at the start of an event: the same bytes further
    in belong to the event's content. The usage chunk (once per request) is the only one parsed, and the observer has
    already said which one it is (`ex.usage` changed).
    """

    __slots__ = ("ex", "model_value", "reasoning_field", "id_prefix", "_head_old", "_head_new", "_rkey",
                 "_usage_seen")

    def __init__(self, ex: "Exchange | None", public_model: str | None, reasoning_field: ReasoningField | None,
                 id_prefix: bytes | None) -> None:
        self.ex = ex
        self.model_value = orjson.dumps(public_model) if public_model else None
        self.reasoning_field = reasoning_field
        self.id_prefix = id_prefix
        self._head_old: bytes | None = None
        self._head_new = b""
        self._rkey: bytes | None = None  # the engine's reasoning key, once seen
        self._usage_seen: object = ex.usage if ex is not None else None

    def event(self, data: bytes) -> bytes:
        old = self._head_old
        if old is _SAME and data.startswith(self._head_new):
            out = data  # the engine already says what the client should see: nothing to do
        elif old is not None and old is not _SAME and data.startswith(old):
            # Only where the event starts with it: the same bytes further in are another event's
            # content (a tool's description, a Responses object), never a head to rewrite.
            out = self._head_new + data[len(old):]
        else:
            out = self._head(data)  # no head learnt yet, or this event's head differs
        rf = self.reasoning_field
        if rf is not None:
            out = self._reasoning(out, rf)
        ex = self.ex
        if ex is None or ex.usage is not self._usage_seen:  # the observer just read a usage object here
            if ex is not None:
                self._usage_seen = ex.usage
            if b'"reasoning_tokens":' in out and _DETAILS not in out:
                out = _usage_details(out)
        return out

    def body(self, data: bytes) -> bytes:
        self._head_old = None
        data = self._head(data)
        if self.model_value is not None:  # e.g. a Responses API body names it again further on
            data = _replace_values(data, _MODEL, self.model_value)
        if self.reasoning_field is not None:
            data = self._reasoning(data, self.reasoning_field)
        if b'"reasoning_tokens":' in data and _DETAILS not in data:
            data = _usage_details(data)
        return data

    def _head(self, data: bytes) -> bytes:
        """The slow way, for the first chunk: rewrite the id and the model where they are, and keep
        the (old, new) head when both sit before the end of the model value."""
        original = data
        id_at = -1
        prefix = self.id_prefix
        if prefix is not None:
            i = data.find(_ID)
            if i >= 0 and not data.startswith(prefix, i + 6):
                data = data[:i + 6] + prefix + data[i + 6:]
                id_at = i
        if self.model_value is not None:
            k = data.find(_MODEL)
            end = _string_end(data, k + len(_MODEL)) if k >= 0 else -1
            if end > 0:
                data = data[:k + len(_MODEL)] + self.model_value + data[end:]
                new_end = k + len(_MODEL) + len(self.model_value)
                tail = len(data) - new_end
                if id_at < k:  # both rewrites are in the head; what follows is the same in both
                    head_old, self._head_new = original[:len(original) - tail], data[:new_end]
                    self._head_old = _SAME if head_old == self._head_new else head_old
        return data

    def _reasoning(self, data: bytes, rf: str) -> bytes:
        key = self._rkey
        if key is None:
            i = data.find(b'"reasoning')  # one search finds either key (and learns which the engine uses)
            if i < 0:
                return data
            if data.startswith(_REASONING, i):
                key = _REASONING
            elif data.startswith(_REASONING_CONTENT, i):
                key = _REASONING_CONTENT
            else:
                return data
            if _REASONING in data and _REASONING_CONTENT in data:
                key = b""  # the engine sends both already
            self._rkey = key
        if not key:
            return data
        if rf == "both":
            return _duplicate(data, key, _REASONING_CONTENT if key == _REASONING else _REASONING)
        want = _REASONING if rf == "reasoning" else _REASONING_CONTENT
        return data if key == want else data.replace(key, want)


def _usage_details(data: bytes) -> bytes:
    """SGLang: usage.reasoning_tokens -> also usage.completion_tokens_details.reasoning_tokens."""
    head, sep, payload = data.partition(b"data:")
    if not sep:
        head, payload = b"", data
    stripped = payload.strip()
    try:
        obj = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return data
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict) or not isinstance(usage.get("reasoning_tokens"), int):
        return data
    details = usage.get("completion_tokens_details")
    if details is None:
        usage["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    elif isinstance(details, dict) and "reasoning_tokens" not in details:
        details["reasoning_tokens"] = usage["reasoning_tokens"]
    else:
        return data
    out = orjson.dumps(obj)
    return head + sep + b" " + out + b"\n\n" if sep else out


_ID_PREFIX = {"/v1/chat/completions": b"chatcmpl-", "/v1/completions": b"cmpl-"}


def for_lane(ex: "Exchange", lane: "LaneRuntime") -> Reshaper:
    """The reshaper of one exchange (every rewrite is a no-op when the bytes already agree).

    The reasoning field and the id prefix are chat and text completion shapes; any other answer
    (a Responses object names `reasoning` as its settings) gets only its model name."""
    prefix = _ID_PREFIX.get(ex.path)
    return Reshaper(ex, ex.public_model or None, lane.config.reasoning_field if prefix else None, prefix)
