"""What the engine is told, and what it renders from a request: one code path for both directions.

`tell` rewrites a request on the hot path so the engine renders exactly what the gateway predicts
(thinking, the effort *number* the lane maps to, drop_thinking); `read` gives the render options the
engine will use for a request body, with the engine's own precedence. The analysis reads the body as
forwarded, `gateway render` tells then reads: both go through `read`, so they cannot disagree.

vLLM 0.32 (entrypoints/openai/chat_completion/protocol.py `ChatCompletionRequest.build_chat_params`):
the template's variables are `merge_kwargs(chat_template_kwargs, {reasoning_effort: <top-level>, ...})`
(renderers/params.py: later wins, None skipped), then the server's `--default-chat-template-kwargs`
fill what is missing (`ChatParams.with_defaults`). So a top-level `reasoning_effort` (a word from
none/minimal/low/medium/high/xhigh/max; a number is a 400) *overrides* `chat_template_kwargs.reasoning_effort`,
and the template then maps the word with its own table. The gateway therefore drops the top-level word
and states the number in `chat_template_kwargs`, with `thinking` and `drop_thinking`; a request's own
`chat_template_kwargs.drop_thinking` wins over the lane's value (as it wins over the server default).

SGLang (serving_chat.py, DeepSeek-V4.1 encoder path): thinking from `chat_template_kwargs.thinking`;
effort from the top-level `reasoning_effort` through `chat_encoding.dsv41_effort_budget` (a word mapped
with the checkpoint's profile, or an int 1-100 passed through); `encode_messages` is called without
`drop_thinking` (the encoder default, true) and the effort profile comes from the checkpoint: neither
can be told per request, so `gateway check` says the lane's values must equal the engine's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from .effort import DEFAULT_EFFORT_MAP, ENGINE_WORDS, effort_word
from .result import RenderOptions

if TYPE_CHECKING:
    from ..core.config import Lane

ENGINE_DEFAULT_DROP_THINKING = True  # encoding_dsv41.encode_messages(drop_thinking=True) and the template default


def tell(body: dict[str, Any], lane: "Lane", thinking: bool, effort: int | None) -> None:
    """Rewrite `body` (in place) so the lane's engine renders (thinking, effort) and the lane's
    drop_thinking, in the form that engine honours. `effort` is the number the lane maps to."""
    carry = set(lane.render.carry)
    kwargs = dict(body.get("chat_template_kwargs") or {}) if isinstance(body.get("chat_template_kwargs"), dict) else {}
    if lane.engine == "vllm":
        if "chat_template_kwargs" in carry:
            kwargs["thinking"] = thinking
            kwargs["enable_thinking"] = thinking
            if effort is not None:
                kwargs["reasoning_effort"] = effort
                # A top-level word would override the number (build_chat_params merges it last).
                body.pop("reasoning_effort", None)
            if not isinstance(kwargs.get("drop_thinking"), bool):
                kwargs["drop_thinking"] = lane.render.drop_thinking
            body["chat_template_kwargs"] = kwargs
        elif "reasoning_effort" in carry:
            word = effort_word(effort, lane.render.effort_map)
            if word is not None:
                body["reasoning_effort"] = word
    else:
        if "reasoning_effort" in carry:
            if effort is None:
                body.pop("reasoning_effort", None)
            else:
                # The lane's word when it has exactly one (SGLang maps it with the checkpoint's profile,
                # which the lane's effort_map mirrors); else the number, which dsv41_effort_budget passes on.
                word = effort_word(effort, lane.render.effort_map)
                body["reasoning_effort"] = word if word is not None else effort
        if "chat_template_kwargs" in carry:
            kwargs["thinking"] = thinking
            kwargs["enable_thinking"] = thinking
            body["chat_template_kwargs"] = kwargs
    if "thinking" in carry:
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}


def read(body: dict[str, Any], defaults: RenderOptions) -> RenderOptions:
    """The render options the engine uses for `body`; what it is not told comes from the lane (which
    must equal the engine's defaults: `gateway check`)."""
    kw = body.get("chat_template_kwargs")
    kw = kw if isinstance(kw, dict) else {}
    upd: dict[str, Any] = {}
    top = body.get("reasoning_effort")
    if defaults.engine == "vllm":
        if isinstance(kw.get("thinking"), bool):
            upd["thinking"] = kw["thinking"]
        effort = top if top is not None else kw.get("reasoning_effort")
        if effort is not None:
            upd["reasoning_effort"] = effort
        if isinstance(kw.get("effort_map"), dict) and kw["effort_map"]:
            upd["effort_map"] = kw["effort_map"]
        if isinstance(kw.get("drop_thinking"), bool):
            upd["drop_thinking"] = kw["drop_thinking"]
    else:
        if kw.get("thinking") is not None:
            upd["thinking"] = bool(kw["thinking"])
        if top is not None:
            upd["reasoning_effort"] = top
    return dataclasses.replace(defaults, **upd) if upd else defaults


def untold(lane: "Lane") -> list[str]:
    """Lane render settings the engine cannot be told per request: each must equal the engine's default."""
    out: list[str] = []
    r = lane.render
    if r.template is None:
        return out
    carry = set(r.carry)
    if lane.engine == "vllm":
        if "chat_template_kwargs" not in carry:
            out.append("render.carry lacks chat_template_kwargs: thinking, the effort number and drop_thinking "
                       "cannot be told to vLLM; the lane's values must equal the engine's defaults "
                       "(thinking false, drop_thinking true, effort 'high' mapped by the template's own table)")
    elif lane.engine == "sglang":
        if r.drop_thinking is not ENGINE_DEFAULT_DROP_THINKING:
            out.append("render.drop_thinking is false, but SGLang's DeepSeek-V4.1 path cannot be told drop_thinking "
                       "(encode_messages runs with its default, true): the lane's value must be true")
        engine_words = {w: n for w, n in (r.effort_map or {}).items() if w in ENGINE_WORDS}
        if engine_words and engine_words != {w: DEFAULT_EFFORT_MAP[w] for w in ENGINE_WORDS}:
            out.append("render.effort_map differs from SGLang's reference table: SGLang maps effort words with the "
                       "checkpoint's own profile, which the lane's effort_map must equal (numbers are passed as is)")
    return out


def options_for_request(body: Mapping[str, Any], defaults: RenderOptions) -> RenderOptions:
    """The render options the lane's engine uses for `body` (`read`: the engine's own precedence of
    `reasoning_effort`, `chat_template_kwargs.{thinking, reasoning_effort, drop_thinking}`)."""
    return read(dict(body), defaults)
