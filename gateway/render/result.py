"""What a render takes and gives back: its options, its error, the prompt as segments, and what one
turn's render lends the conversation's next turn.

These are the types the rest of the gateway reads (drift classification, fingerprints, the analysis memo,
the limits): they hold data and answer questions about it, and render nothing; `Renderer` (renderer.py)
makes them. `Previous` keeps the request as prepared (`Prepared`: messages, digests, plan) and the
answer as rendered (`Said`), so that the next turn reuses whatever its unchanged messages render.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .cache import ItemEntry, RenderedItem
from .plan import Item
from .provenance import innermost
from .template import ChatTemplate


def xxh64(text: str) -> int:
    return xxhash.xxh64_intdigest(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class RenderOptions:
    template: str | None = "deepseek_v4.1"  # file name under chat_templates/ without .jinja; None: no template
    thinking: bool = True
    reasoning_effort: str | int | None = None  # raw request value
    effort_map: Mapping[str, int] | None = None  # None = template default
    drop_thinking: bool = True
    tokenizer_path: str | None = None
    engine: str = "sglang"  # request normalisation of the lane's engine: "sglang" (reference) or "vllm"


class RenderError(ValueError):
    """The request cannot be rendered; `param` names the offending field, e.g. messages[3].content[1]."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.message = message
        self.param = param

    def to_gateway_error(self):
        from gateway.core.errors import invalid_request

        return invalid_request(f"{self.param}: {self.message}" if self.param else self.message,
                               param=self.param, code="invalid_prompt")


@dataclass(frozen=True, slots=True)
class Segment:
    message_index: int  # request index of the (first) message this span renders; -1 = inserted system
    role: str  # "system", "user", "assistant", "tool", "developer"; "prefix" for an inserted system
    text: str
    token_ids: Sequence[int]  # array('I')
    fields: Sequence[tuple[str, int, int]]  # char spans inside text (a shared tuple: do not mutate)
    digest: int  # xxhash64 of text
    message_indices: tuple[int, ...] = ()  # every request message this span renders

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Rendered:
    segments: list[Segment]
    exact: bool = True  # False: estimated (no known template / tokenizer)
    render_misses: int = 0  # items rendered by the template for this request (cache misses)
    token_misses: int = 0  # segments tokenized for this request
    engine_cut: int = 0  # segments whose ids were cut from the engine's prompt ids (engine_ids.py)
    _prompt: str | None = field(default=None, repr=False)
    _ids: list[int] | None = field(default=None, repr=False)
    message_digests: list[int] | None = field(default=None, repr=False)  # per request message (render_turn)
    # What the template dropped: assistants with a request index below dropped[0] render without their
    # reasoning; developer messages below dropped[1] are deleted (thinking mode, drop on, no tools).
    dropped: tuple[int, int] = (0, 0)
    _provenance: Any = field(default=None, repr=False)
    previous: Any = field(default=None, repr=False)  # Previous: lent to the conversation's next turn

    def source_at(self, segment: int, char_offset: int) -> tuple[str | None, int]:
        """(field, request message index) of the character at `char_offset` in segment `segment`: the
        innermost field span holding it, and the message that field renders; inside a merged user/tool
        group, the member (tool results in the order the template sorted them). A character between two
        spans belongs to what follows it. Index -1: the inserted system message."""
        seg = self.segments[segment]
        if self._provenance is None:
            return innermost(seg.fields, char_offset), seg.message_index
        return self._provenance.source_at(segment, char_offset)

    @property
    def prompt(self) -> str:
        if self._prompt is None:
            self._prompt = "".join(s.text for s in self.segments)
        return self._prompt

    @property
    def token_array(self) -> array:
        """All token ids as one array('I') (cheaper than the list)."""
        a = array("I")
        for s in self.segments:
            a.extend(s.token_ids) if isinstance(s.token_ids, array) else a.extend(array("I", s.token_ids))
        return a

    @property
    def token_ids(self) -> list[int]:
        if self._ids is None:
            self._ids = self.token_array.tolist()
        return self._ids

    @property
    def n_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def token_spans(self) -> list[tuple[Segment, int, int]]:
        """(segment, start token, end token) in prompt order."""
        out, pos = [], 0
        for s in self.segments:
            out.append((s, pos, pos + len(s.token_ids)))
            pos += len(s.token_ids)
        return out


@dataclass
class Prepared:
    """A validated request, ready to render: effective messages (inserted system first) and plan."""

    options: RenderOptions
    template: ChatTemplate
    effort: int | None
    tools: list | None
    response_format: Any
    offset: int  # 1 when an empty system message was inserted at index 0
    msgs: list[dict]  # raw messages (inserted system included)
    digests: list[int]
    items: list[Item]
    ctx_digest: int  # digest of tools + response_format (rendered by the first item only)
    dropped: tuple[int, int] = (0, 0)  # see Rendered.dropped
    roles: list[str] = field(default_factory=list)  # of msgs
    eff_drop: bool = False
    last_ul2: int = -1  # plan's: reasoning dropped up to here (-1: none)
    kept: int = 0  # leading items taken from the previous turn's plan (their render too)
    held: list = field(default_factory=list)  # the previous turn's entries for them, when evicted from the cache
    said: "Said | None" = None  # the previous turn's generated answer, which this request may send back


@dataclass
class Previous:
    """A conversation's previous render, lent to its next turn (render_turn's `previous`): the first
    `unchanged` request messages of the next turn are, byte for byte, this turn's (conversations/
    rawbody.py), so their parse, normalisation, digests, plan items and segments are reused."""

    prep: Prepared
    entries: list[ItemEntry]
    keys: list[tuple]
    groups: list[list[int]]
    segments: list[Segment]
    said: "Said | None" = None  # what the model answered to this request, rendered (render_turn)

    def nbytes(self) -> int:
        """Rough: what keeping it costs beyond the render cache's own entries (lists and plan)."""
        said = 2 * len(self.said.item.text) + 4 * len(self.said.ids or ()) + 300 if self.said is not None else 0
        return 300 * len(self.prep.msgs) + 200 * len(self.entries) + said


@dataclass
class Said:
    """The generated answer as `_generated` rendered it, at request index `index` of the next turn."""

    index: int
    message: dict  # normalized
    item: RenderedItem
    ids: Any  # array('I') or None
    think: bool
    template: ChatTemplate

    def segment(self) -> Segment:
        return Segment(self.index, "assistant", self.item.text, self.ids, self.item.fields, self.item.digest,
                       (self.index,))
