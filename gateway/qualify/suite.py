"""The fixed prompts: the determinism suite, the sink probes, and the performance shapes.

Everything here is deterministic: the same code builds the same requests byte for byte, and
`SUITE_ID` changes whenever it would not (so hashes of two different suites are never compared).
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

DEFAULT_SEED = 1234

_WORDS = tuple(
    """time year people way day man thing woman life child world school state family student group
    country problem hand part place case week company system program question work government number
    night point home water room mother area money story fact month lot right study book eye job word
    business issue side kind head house service friend father power hour game line end member law car
    city community name president team minute idea kid body information back parent face others level
    office door health person art war history party result change morning reason research girl guy
    moment air teacher force education river bridge engine signal garden market harbor valley winter
    summer autumn spring forest mountain ocean island village castle library museum theater station""".split()
)


def filler(n_words: int, seed: int) -> str:
    """About `n_words` tokens of plain English-like text (one common word is about one token)."""
    rng = random.Random(seed)
    out: list[str] = []
    sentence: list[str] = []
    for _ in range(n_words):
        sentence.append(rng.choice(_WORDS))
        if len(sentence) >= rng.randint(8, 16):
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


@dataclass(frozen=True)
class Prompt:
    name: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()

    def body(self, *, temperature: float, seed: int | None, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [dict(m) for m in self.messages], "temperature": temperature,
                                "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = seed
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
            body["tool_choice"] = "auto"
        return body


def _user(text: str) -> tuple[dict[str, Any], ...]:
    return ({"role": "user", "content": text},)


DETERMINISM_SUITE: tuple[Prompt, ...] = (
    Prompt("short", _user("What is the capital of France? Answer in one sentence.")),
    Prompt(
        "long",
        (
            {"role": "system", "content": "You are a careful assistant. Summaries are three sentences long."},
            {"role": "user", "content": "Summarise the following notes.\n\n" + filler(2000, seed=7)},
        ),
    ),
    Prompt(
        "tool_call",
        (
            {"role": "system", "content": "Use the tools when they help."},
            {"role": "user", "content": "What is the weather in Paris right now, in celsius?"},
        ),
        tools=(WEATHER_TOOL,),
    ),
    Prompt(
        "multilingual",
        _user("Translate into English, French and Japanese: 今天的天气很好，我们去公园散步吧。"
              " Antworte kurz. Ответь кратко. أجب باختصار."),
    ),
)

SINK_PROBES: tuple[str, ...] = ("Say hi.", "Hello", "Hi there!", "Say hello.", "Hey")
SINK_TEMPERATURES: tuple[float, ...] = (0.0, 1.0)


def suite_id(max_tokens: int, seed: int) -> str:
    """Fingerprint of the determinism suite as sent: hashes are only comparable under the same id."""
    spec = [p.body(temperature=0.0, seed=seed, max_tokens=max_tokens) for p in DETERMINISM_SUITE]
    return "suite-" + xxhash.xxh3_64_hexdigest(orjson.dumps([p.name for p in DETERMINISM_SUITE]) + orjson.dumps(spec))


# -- performance shapes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    kind: str  # "decode" (one stream, prompt of `prompt_tokens`) | "throughput" (`concurrency` streams)
    prompt_tokens: int
    concurrency: int = 1

    @property
    def name(self) -> str:
        if self.kind == "decode":
            return f"decode@{_k(self.prompt_tokens)}"
        return f"throughput@{self.concurrency}"

    def metrics(self) -> list[tuple[str, str, bool]]:
        """(metric name, unit, higher is better)."""
        if self.kind == "decode":
            return [(f"{self.name} decode", "tok/s", True), (f"{self.name} ttft", "ms", False)]
        return [(f"{self.name} throughput", "tok/s", True)]


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


THROUGHPUT_PROMPT_TOKENS = 512
DEFAULT_SHAPES = "decode@2k,decode@32k,throughput@1,throughput@2,throughput@4"
FULL_SHAPES = ("decode@2k,decode@8k,decode@32k,decode@48k,"
               "throughput@1,throughput@2,throughput@4,throughput@8,throughput@16")
# Filler words per prompt token: ~1.0 with a whitespace tokenizer, ~1.12 tokens per word with DeepSeek's.
WORDS_PER_TOKEN = 0.93


def parse_shapes(text: str) -> list[Shape]:
    """`decode@2k,decode@32k,throughput@1,throughput@4` (decode@N: prompt tokens; throughput@N: streams)."""
    shapes: list[Shape] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(decode|throughput)@(\d+)(k?)", part.lower())
        if not m:
            raise ValueError(f"bad shape {part!r}: use decode@<tokens>[k] or throughput@<concurrency>")
        n = int(m.group(2)) * (1024 if m.group(3) else 1)
        if n <= 0:
            raise ValueError(f"bad shape {part!r}: the number must be positive")
        if m.group(1) == "decode":
            shapes.append(Shape("decode", n))
        else:
            if m.group(3):
                raise ValueError(f"bad shape {part!r}: throughput takes a concurrency, not a size")
            shapes.append(Shape("throughput", THROUGHPUT_PROMPT_TOKENS, n))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def perf_body(shape: Shape, max_tokens: int, engine: str) -> dict[str, Any]:
    """A cold request (a unique first line defeats the prefix cache) of about the shape's prompt size."""
    nonce = uuid.uuid4().hex
    # Words are ~1 token each; the 40 covers the instruction and the chat template's headers.
    words = int((shape.prompt_tokens - 40) * WORDS_PER_TOKEN)
    text = f"[run {nonce}]\n" + filler(max(16, words), seed=shape.prompt_tokens)
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": text + "\n\nContinue this text."}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    if engine in ("vllm", "sglang"):
        body["ignore_eos"] = True  # decode the full length: speed over a fixed number of tokens
    return body
