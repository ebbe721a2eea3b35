"""Prompt and output tokenization feeding the emulator's prefix cache.

The default ("simple") tokenizer renders each message canonically and hashes whitespace-separated
words with xxhash32. Its one promise is the property real chat templates have on an append-only
conversation: rendering `messages + [assistant_output, next_user]` starts with exactly
`tokenize_prompt(previous body) + tokenize_generated(previous body, assistant_output)`.
That holds because a prompt is `BOS, [effort], [tools], (role header + body)*, assistant header` and
the generated part is the body of the assistant message as the client will append it.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson
import xxhash

TokenizePrompt = Callable[[dict[str, Any]], list[int]]
TokenizeGenerated = Callable[[dict[str, Any], dict[str, Any]], list[int]]
Detokenize = Callable[[list[int]], str]

_h32 = xxhash.xxh32_intdigest


def _marker(name: str) -> int:
    return _h32(f"<|{name}|>".encode())


BOS = _marker("begin_of_sentence")
EOT = _marker("end_of_turn")
THINK = _marker("think")
THINK_END = _marker("/think")
TOOL_CALL = _marker("tool_call")
TOOLS = _marker("tools")
IMAGE = _marker("image")
EFFORT = _marker("reasoning_effort")
_ROLES: dict[str, int] = {r: _marker(r) for r in ("system", "developer", "user", "assistant", "tool")}
ASSISTANT = _ROLES["assistant"]


def words(text: str) -> list[int]:
    """One token per whitespace-separated word. Bytes-level split: one encode, no per-word encode."""
    return list(map(_h32, text.encode().split()))


def _role(role: Any) -> int:
    return _ROLES.get(role) or _marker(str(role))


def _content(content: Any, out: list[int]) -> None:
    if isinstance(content, str):
        out += words(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text":
                out += words(str(part.get("text") or ""))
            elif kind in ("image_url", "image", "input_image"):
                ref = part.get("image_url") or part.get("image") or ""
                if isinstance(ref, dict):
                    ref = ref.get("url") or ""
                out.append(IMAGE)
                out.append(_h32(str(ref).encode()))
            else:
                out.append(_marker(str(kind)))


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else orjson.dumps(args).decode()


def message_body(message: dict[str, Any]) -> list[int]:
    """The tokens of one message after its role header. Reasoning is kept (both field spellings)."""
    out: list[int] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append(THINK)
        out += words(reasoning)
        out.append(THINK_END)
    _content(message.get("content"), out)
    for call in message.get("tool_calls") or ():
        fn = (call.get("function") if isinstance(call, dict) else None) or {}
        out.append(TOOL_CALL)
        out += words(str(fn.get("name") or ""))
        out += words(_arguments(fn.get("arguments") or ""))
    out.append(EOT)
    return out


class _Memo:
    """Message-level memo: a long agent conversation re-sends the same messages every turn."""

    def __init__(self, capacity: int = 16384) -> None:
        self._items: OrderedDict[int, list[int]] = OrderedDict()
        self._capacity = capacity

    def get(self, key_obj: Any, build: Callable[[], list[int]]) -> list[int]:
        key = xxhash.xxh3_128_intdigest(orjson.dumps(key_obj))
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
            return hit
        value = build()
        self._items[key] = value
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)
        return value


_memo = _Memo()


def simple_tokenize_prompt(body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _completion_prompt(body.get("prompt"))
    toks = [BOS]
    effort = body.get("reasoning_effort")
    if effort is not None:
        # Like DeepSeek-V4: the effort is rendered at the very start, so changing it moves token 2.
        toks += (EFFORT, _h32(str(effort).encode()))
    tools = body.get("tools")
    if tools:
        toks.append(TOOLS)
        toks += _memo.get(tools, lambda: words(orjson.dumps(tools).decode()))
    for m in messages:
        if not isinstance(m, dict):
            continue
        toks.append(_role(m.get("role")))
        toks += _memo.get(m, functools.partial(message_body, m))
    toks.append(ASSISTANT)
    return toks


def simple_tokenize_generated(body: dict[str, Any], message: dict[str, Any]) -> list[int]:
    if isinstance(body.get("messages"), list):
        return message_body(message)
    return words(str(message.get("content") or ""))


def _completion_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [t & 0xFFFFFFFF for t in prompt]  # already token ids
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return [BOS, *words(str(prompt or ""))]


def dsv41_tokenizers(default_thinking: Callable[[], bool] = lambda: False,
                     engine: str = "sglang") -> tuple[TokenizePrompt, TokenizeGenerated]:
    """The real DeepSeek-V4.1 renderer + tokenizer (gateway.render). Imported lazily: it loads a 128K vocab.

    Thinking follows the emulator's own rule (explicit flags, else effort set and not "none", else the
    `default_thinking` knob) so the prompt and the generated text agree with what the emulator says.
    Messages and template kwargs are read the way `engine` (the emulator's flavour) reads them
    (gateway/render/normalize.py and told.py): an SGLang-shaped emulator ignores vLLM's `reasoning`.
    """
    import dataclasses

    from gateway.render.renderer import Renderer
    from gateway.render.result import RenderOptions
    from gateway.render.told import options_for_request
    from gateway.render.tokenizer import load_tokenizer

    from .generation import thinking_enabled

    renderer = Renderer(RenderOptions(engine=engine if engine in ("vllm", "sglang") else "sglang"))
    tokenizer = load_tokenizer(None)

    def options(body: dict[str, Any]) -> tuple[dict[str, Any], RenderOptions]:
        thinking = thinking_enabled(body, default_thinking())
        effort = body.get("reasoning_effort")
        if isinstance(effort, str) and effort.lower() == "none":
            body = {k: v for k, v in body.items() if k != "reasoning_effort"}  # the template has no "none"
        return body, dataclasses.replace(options_for_request(body, renderer.defaults), thinking=thinking)

    def tokenize_prompt(body: dict[str, Any]) -> list[int]:
        if not isinstance(body.get("messages"), list):
            return list(tokenizer.encode(str(body.get("prompt") or "")))
        body, opts = options(body)
        return renderer.render(body, opts).token_ids

    def tokenize_generated(body: dict[str, Any], message: dict[str, Any]) -> list[int]:
        if not isinstance(body.get("messages"), list):
            return list(tokenizer.encode(str(message.get("content") or "")))
        body, opts = options(body)
        return list(renderer.render_generated(body, message, opts).token_ids)

    return tokenize_prompt, tokenize_generated


def tokenizers_for(name: str, default_thinking: Callable[[], bool] = lambda: False,
                   flavour: str = "sglang") -> tuple[TokenizePrompt, TokenizeGenerated]:
    if name == "simple":
        return simple_tokenize_prompt, simple_tokenize_generated
    if name == "dsv41":
        return dsv41_tokenizers(default_thinking, flavour)
    raise ValueError(f"unknown tokenizer {name!r}")


def placeholder_detokenize(ids: list[int]) -> str:
    """A tokenizer without a vocabulary spells each id as itself."""
    return " ".join(f"<{t}>" for t in ids)


def detokenizer_for(name: str) -> Detokenize:
    """What /detokenize answers with: the real tokenizer's spelling of each id where there is one."""
    if name == "dsv41":
        from gateway.render.tokenizer import load_tokenizer

        return load_tokenizer(None).decode
    return placeholder_detokenize


def count_images(body: dict[str, Any]) -> int:
    """Images across the whole history, the way vLLM counts them against --limit-mm-per-prompt."""
    n = 0
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in ("image_url", "image", "input_image"):
                    n += 1
    return n
