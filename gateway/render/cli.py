"""`gateway render request.json --lane NAME`: what the lane's engine will see (wired in gateway/cli/main.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .estimate import Estimator
from .checks import effective_effort
from .renderer import Renderer
from .result import Rendered, RenderOptions
from .told import options_for_request

if TYPE_CHECKING:
    from ..core.config import Lane


def as_forwarded(body: dict, lane: "Lane | None") -> dict:
    """The request as the gateway forwards it to the lane's engine on a conversation's first turn
    (thinking and effort pinned to the request's own values and told to the engine, render/told.py)."""
    if lane is None or lane.render.template is None or lane.effort_policy == "off":
        return body
    from ..conversations.effort import resolve
    from .told import tell

    out = dict(body)
    choice = resolve(out, lane)
    tell(out, lane, choice.thinking, choice.effort if isinstance(choice.effort, int) else None)
    return out


def render_request(body: dict, options: RenderOptions | None, *, apply_request_overrides: bool = True,
                   lane: "Lane | None" = None) -> Rendered:
    """Render `body` for a lane: exactly when the lane has a template, else as an estimate. With the
    lane, the body is first rewritten as the gateway forwards it; the options are then read from it the
    way the engine reads them: the same code path as the analysis of a live turn.

    A lane whose template cannot be loaded raises TemplateNotFound: never a silent estimate in its place.
    """
    if options is None or not options.template:
        return Estimator().render(body)
    body = as_forwarded(body, lane)
    if apply_request_overrides:
        options = options_for_request(body, options)
    return Renderer(options).render(body, options)


def render_command(request: str | dict[str, Any], options: RenderOptions | None, summary: bool = False,
                   lane: "Lane | None" = None) -> str:
    """The prompt (or with `summary` the token count and per-message token spans) for a request file.

    The file holds an OpenAI chat request body; the request's own reasoning_effort / thinking /
    chat_template_kwargs apply on top of the lane's options. Raises RenderError for bad input.
    """
    body = request if isinstance(request, dict) else json.loads(Path(request).read_text(encoding="utf-8"))
    r = render_request(body, options, lane=lane)
    if not summary:
        return r.prompt
    lines = []
    if r.exact:
        opts = options_for_request(as_forwarded(body, lane), options)  # type: ignore[arg-type]
        eff = effective_effort(opts)
        lines.append(
            f"template {opts.template}  thinking {'on' if opts.thinking else 'off'}  "
            f"effort {eff if eff is not None else '-'}  drop_thinking {'on' if opts.drop_thinking else 'off'}"
        )
        lines.append(f"tokens {r.n_tokens}  chars {len(r.prompt)}  segments {len(r.segments)}")
    else:
        lines.append("no chat template for this lane: message-level estimate (cl100k_base tokens), not exact")
        lines.append(f"estimated tokens {Estimator.estimated_prompt_tokens(r)}  messages {len(r.segments)}")
    lines.append(f"{'msg':>5}  {'role':<10} {'tokens':>17}  {'chars':>19}  messages")
    tpos = cpos = 0
    for s in r.segments:
        nt, nc = len(s.token_ids), len(s.text)
        idx = "-" if s.message_index < 0 else str(s.message_index)
        members = s.message_indices
        extra = f"{members[0]}-{members[-1]}" if len(members) > 1 else ""
        lines.append(
            f"{idx:>5}  {s.role:<10} {f'{tpos}-{tpos + nt}':>17}  {f'{cpos}-{cpos + nc}':>19}  {extra}".rstrip()
        )
        tpos += nt
        cpos += nc
    return "\n".join(lines) + "\n"
