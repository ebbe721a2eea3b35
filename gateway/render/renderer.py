"""Render an OpenAI chat request into the exact prompt (text and token ids) a lane's engine builds.

The chat template (chat_templates/<name>.jinja) is the source of truth for every byte. Its macro
`render_item` renders one output item: one message, or a run of consecutive user/tool messages merged
into one user turn, together with the generation header the reference attaches to it. The template's
top level computes each item's context (first item, effort, reasoning kept or dropped, header kind,
tool-call order) and calls the macro; `Renderer` computes the same context in Python (`plan`) and
calls the same macro, once per item it has not seen before. Tests check that the assembled result
equals the full template render.

Segments are items, so each one starts and ends at a special token (BOS, <｜User｜>, <｜System｜>,
<｜Assistant｜>, <think>, </think>, EOS): tokenizing segments separately and concatenating equals
tokenizing the whole prompt. Where a boundary would fall between two plain-text spans (a system
message followed directly by an assistant message) the two items share one segment.
"""

from __future__ import annotations

import bisect
import json
import secrets
from array import array
from collections.abc import Sequence
from typing import Any

import jinja2
import orjson
import xxhash

from .normalize import ENGINES, template_messages, template_response_format, template_tools
from .cache import ItemEntry, RenderedItem, SegmentCache, default_cache
from .checks import ROLES, effective_effort, normalize_message
from .plan import HEADERS, Item, Resume, plan, start
from .provenance import Provenance
from .result import Prepared, Previous, Rendered, RenderError, RenderOptions, Said, Segment, xxh64
from .template import HEADER_PREFIX, ChatTemplate, load_template
from .tokenizer import TextTokenizer, load_tokenizer

SPECIAL_BOUNDARY_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<think>",
    "</think>",
)
FIELD_NAMES = (
    "bos", "header", "effort", "content", "tools", "response_format", "tool_result",
    "reasoning_content", "think_end", "tool_calls", "eos", "generation_header",
)

# Below this many characters to tokenize, the engine's prompt ids are not spelled out (engine_ids.py):
# tokenizing a small text costs less than reading the whole prompt's ids.
ENGINE_IDS_MIN_CHARS = 16_384
_HEADER_AT = 7  # in an item's cache key (_item_key)

# Per-process marker: the template emits it only when the gateway sets `segment_marker`.
_MARK = "\x00" + secrets.token_hex(6) + "\x00"
_FM = {"e": _MARK + "e" + _MARK, **{n: _MARK + "f" + n + _MARK for n in FIELD_NAMES}}


def _digest_obj(obj: Any) -> int:
    try:
        data = orjson.dumps(obj)
    except TypeError:  # e.g. integers beyond 64 bits
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return xxhash.xxh64_intdigest(data)


def _last(group: list[int]) -> int:
    return group[-1]


def _joined(groups: list[list[int]]) -> list[int]:
    """Positions of the groups of more than one item (rare: a system message right before an
    assistant's); a C-speed check first, as this runs on every turn over every group."""
    lengths = list(map(len, groups))
    if max(lengths, default=0) < 2:
        return []
    return [j for j, n in enumerate(lengths) if n > 1]


_suffix_ids: dict[tuple[str, str], array] = {}


def _header_ids(tok_path: str, suffix: str) -> array:
    ids = _suffix_ids.get((tok_path, suffix))
    if ids is None:
        ids = _suffix_ids[(tok_path, suffix)] = load_tokenizer(tok_path).encode(suffix) if suffix else array("I")
    return ids


def _with_header(entry: ItemEntry, old: str | None, new: str | None, tok_path: str) -> ItemEntry | None:
    """`entry` (rendered with generation header `old`) as rendered with header `new`; None if its text
    or fields are not of the expected shape."""
    ri = entry.item
    text = ri.text
    old_suffix = HEADER_PREFIX + old if old else ""
    fields = ri.fields
    body_end = len(text) - len(old_suffix)
    if old_suffix:
        if not text.endswith(old_suffix) or not fields or fields[-1] != ("generation_header", body_end, len(text)):
            return None
        fields = fields[:-1]
    new_suffix = HEADER_PREFIX + new if new else ""
    text = text[:body_end] + new_suffix
    if new_suffix:
        fields = fields + (("generation_header", body_end, len(text)),)
    out = ItemEntry(_item(text, fields))
    ids = entry.ids
    if ids is not None and isinstance(ids, array):
        old_ids, new_ids = _header_ids(tok_path, old_suffix), _header_ids(tok_path, new_suffix)
        cut = len(ids) - len(old_ids)
        if cut >= 0 and ids[cut:] == old_ids:
            out.ids = ids[:cut] + new_ids
    return out


def _json_of(m: dict, name: str) -> bytes | None:
    if name not in m:
        return None
    try:
        return orjson.dumps(m[name])  # key order kept: the template renders arguments in the given order
    except TypeError:
        return json.dumps(m[name], ensure_ascii=False).encode("utf-8", "surrogatepass")


def _from_said(said: Said, message: dict, tok_path: str) -> ItemEntry | None:
    """The assistant `message` (normalized) as rendered without reasoning, derived from the previous
    turn's render of the generated answer `said` when the message is that answer sent back: the same
    `content` and `tool_calls` (template.reasoning_is_prefix: all that item reads). The reasoning and
    `</think>` that `said` starts with in thinking mode are cut, and so are their token ids (`</think>`
    is a special token: the ids after it are the rest's own). None when the message is another."""
    if _json_of(message, "content") != _json_of(said.message, "content") or \
            _json_of(message, "tool_calls") != _json_of(said.message, "tool_calls"):
        return None
    ri = said.item
    ids = said.ids if isinstance(said.ids, array) else None
    if not said.think:
        out = ItemEntry(ri)
        out.ids = ids
        return out
    f = ri.fields
    if len(f) < 2 or f[0][0] != "reasoning_content" or f[0][1] != 0 or f[1][0] != "think_end" or \
            f[1][1] != f[0][2] or ri.text[f[1][1]:f[1][2]] != "</think>":
        return None
    cut = f[1][2]
    out = ItemEntry(_item(ri.text[cut:], tuple((n, s - cut, e - cut) for n, s, e in f[2:])))
    if ids is not None and ri.text.count("</think>") == 1:
        end = load_tokenizer(tok_path).token_to_id("</think>")
        if end is not None and ids.count(end) == 1:
            out.ids = ids[ids.index(end) + 1:]
    return out


def _item(text: str, fields: tuple) -> RenderedItem:
    return RenderedItem(text, fields, xxh64(text), text.startswith(SPECIAL_BOUNDARY_TOKENS),
                        text.endswith(SPECIAL_BOUNDARY_TOKENS))


def _parse_marked(out: str) -> tuple[int, str, tuple[tuple[str, int, int], ...]]:
    """Split a marked render of one item into (index, text, fields)."""
    parts = out.split(_MARK)
    if len(parts) < 3 or parts[0] or not parts[1].startswith("s"):
        raise RuntimeError("chat template did not emit the segment marker")
    idx = int(parts[1][1:])
    texts: list[str] = []
    fields: list[tuple[str, int, int]] = []
    pos = 0
    cur: tuple[str, int] | None = None
    for j in range(2, len(parts)):
        p = parts[j]
        if j % 2 == 0:
            if p:
                texts.append(p)
                pos += len(p)
        elif p == "e":
            if cur is not None:
                fields.append((cur[0], cur[1], pos))
                cur = None
        elif p.startswith("f"):
            cur = (p[1:], pos)
        else:
            raise RuntimeError(f"unexpected marker {p!r} in a single-item render")
    return idx, "".join(texts), tuple(fields)


# ------------------------------------------------------------------------------------------------


class Renderer:
    """Renders requests for one lane configuration. Thread-safe; share one per lane."""

    def __init__(self, options_defaults: RenderOptions | None = None, *, cache: SegmentCache | None = None) -> None:
        self.defaults = options_defaults or RenderOptions()
        self.cache = cache if cache is not None else default_cache()

    # -- public -----------------------------------------------------------------------------------
    def render(self, body: dict, options: RenderOptions | None = None) -> Rendered:
        prep = self._prepare(body, options or self.defaults)
        tok = load_tokenizer(prep.options.tokenizer_path)
        entries, keys, misses = self._render_items(prep)
        return self._assemble(prep, entries, keys, tok, misses)

    def render_text(self, body: dict, options: RenderOptions | None = None) -> str:
        """The prompt text only (no tokenization)."""
        prep = self._prepare(body, options or self.defaults)
        return "".join(e.item.text for e in self._render_items(prep)[0])

    def render_template(self, body: dict, options: RenderOptions | None = None, *, segment_marker: str = "") -> str:
        """The whole prompt from one full template render (the engine's path); for checks and debugging."""
        opts = options or self.defaults
        prep = self._prepare(body, opts)
        msgs = prep.msgs[prep.offset:]
        norm = [normalize_message(m, i) for i, m in enumerate(msgs)]
        variables = dict(
            messages=norm,
            tools=prep.tools,
            add_generation_prompt=True,
            thinking=opts.thinking,
            reasoning_effort=opts.reasoning_effort,
            drop_thinking=opts.drop_thinking,
            response_format=prep.response_format,
        )
        if opts.effort_map:
            variables["effort_map"] = dict(opts.effort_map)
        if segment_marker:
            variables["segment_marker"] = segment_marker
        try:
            return prep.template.render(**variables)
        except jinja2.TemplateError as e:
            raise _template_error(e) from None

    def render_turn(self, body: dict, assistant_message: dict, options: RenderOptions | None = None,
                    previous: Previous | None = None, unchanged: int = 0,
                    engine_ids: Sequence[int] | None = None) -> tuple[Rendered, Segment]:
        """`render` and `render_generated` of one request, preparing it once (the per-turn path).

        `previous` and `unchanged`: the conversation's previous render (Rendered.previous) and how many
        leading request messages are byte for byte the same; the result is the same as without them.
        `engine_ids`: the ids the engine prefilled for this request, if it said (_assemble)."""
        prep = self._prepare(body, options or self.defaults, previous if unchanged > 0 else None, unchanged)
        if previous is not None and unchanged > 0:
            prep.said = previous.said
        tok = load_tokenizer(prep.options.tokenizer_path)
        reuse = previous if prep.kept else None
        entries, keys, misses = self._render_items(prep, reuse)
        n, norm, item, think = self._said_item(prep, body, assistant_message)
        key = (tok.path, item.digest, len(item.text))
        ids = self.cache.get_tokens([key])[0]
        also = [item.text] if ids is None else None
        rendered = self._assemble(prep, entries, keys, tok, misses, reuse if prep.kept else None, also, engine_ids)
        if also:
            ids = also[1]
            self.cache.put_tokens([(key, ids)])
        rendered.message_digests = prep.digests[prep.offset:]
        said = Said(n, norm, item, ids, think, prep.template)
        rendered.previous.said = said
        return rendered, said.segment()

    def render_generated(self, body: dict, assistant_message: dict, options: RenderOptions | None = None) -> Segment:
        """The text the model generated for `body`, as rendered when appended as the next message.

        Thinking mode: reasoning + "</think>" + content + DSML tool calls + EOS; chat mode: content +
        DSML + EOS (the prompt already ends in "</think>").
        """
        return self._generated(self._prepare(body, options or self.defaults), body, assistant_message)

    def _generated(self, prep: Prepared, body: dict, assistant_message: dict) -> Segment:
        return self._said(prep, body, assistant_message).segment()

    def _said_item(self, prep: Prepared, body: dict, assistant_message: dict,
                   ) -> tuple[int, dict, RenderedItem, bool]:
        """The generated answer rendered as the next message: (its request index, the message
        normalized, the item, thinking)."""
        n = len(body["messages"])
        m = dict(assistant_message)
        m["role"] = "assistant"
        norm = normalize_message(m, n)
        think = bool(prep.options.thinking)
        c = self._context(prep, Item("assistant", len(prep.msgs), len(prep.msgs), False, think, None, ()))
        return n, norm, self._call_macro(prep.template, "assistant", n, [norm], c), think

    def _said(self, prep: Prepared, body: dict, assistant_message: dict) -> Said:
        n, norm, item, think = self._said_item(prep, body, assistant_message)
        tok = load_tokenizer(prep.options.tokenizer_path)
        key = (tok.path, item.digest, len(item.text))
        ids = self.cache.get_tokens([key])[0]
        if ids is None:
            ids = tok.encode(item.text)
            self.cache.put_tokens([(key, ids)])
        return Said(n, norm, item, ids, think, prep.template)

    def tokens_of(self, digest: int, length: int, options: RenderOptions | None = None):
        """Token ids of an earlier segment by its text digest and length, if still cached (else None)."""
        tok = load_tokenizer((options or self.defaults).tokenizer_path)
        return self.cache.get_tokens([(tok.path, digest, length)])[0]

    # -- preparation ------------------------------------------------------------------------------
    def _prepare(self, body: dict, opts: RenderOptions, previous: Previous | None = None,
                 unchanged: int = 0) -> Prepared:
        if not isinstance(body, dict):
            raise RenderError("the request body must be a JSON object", None)
        effort = effective_effort(opts)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RenderError("must be a non-empty list of messages", "messages")
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise RenderError("must be a list", "tools")
            for j, t in enumerate(tools):
                if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
                    raise RenderError("must be an object with a `function` object", f"tools[{j}]")
        tools = tools or None
        rf = body.get("response_format") or None
        if opts.engine != "sglang":
            rf = template_response_format(opts.engine, body)
            if opts.engine not in ENGINES:
                raise RenderError(f"unknown engine {opts.engine!r} (expected one of {', '.join(ENGINES)})", None)
            tools = template_tools(opts.engine, tools)
        pp = previous.prep if previous is not None else None
        u = min(unchanged, len(messages) - 1) if pp is not None and pp.options.engine == opts.engine else 0
        if u > 0:  # the first u messages were parsed, normalised, validated and digested last turn
            assert pp is not None
            normalized = pp.msgs[pp.offset:pp.offset + u]
            roles = pp.roles[pp.offset:pp.offset + u]
            if len(normalized) != u:
                u, roles = 0, []
        else:
            roles = []
        rest = messages[u:]
        if opts.engine != "sglang":
            rest = template_messages(opts.engine, rest)
        for i, m in enumerate(rest, u):
            if not isinstance(m, dict):
                raise RenderError("must be an object", f"messages[{i}]")
            r = m.get("role")
            if r not in ROLES:
                raise RenderError(f"unsupported role {r!r} (expected one of {', '.join(ROLES)})", f"messages[{i}].role")
            roles.append(r)
        offset = 0
        msgs = (normalized + rest) if u > 0 else rest
        if (tools or rf) and roles[0] != "system":
            offset = 1
            msgs = [{"role": "system", "content": ""}, *msgs]
            roles = ["system", *roles]
        if u > 0 and pp is not None and pp.offset == offset:
            digests = pp.digests[:offset + u] + [_digest_obj(m) for m in msgs[offset + u:]]
        else:
            u = 0
            digests = [_digest_obj(m) for m in msgs]
        eff_drop = bool(opts.thinking and opts.drop_thinking and not tools)
        resume = None
        if u > 0 and pp is not None and pp.options.thinking == opts.thinking and pp.eff_drop == eff_drop:
            resume = Resume(pp.items, offset + u, pp.last_ul2)
        items, drop_a, drop_d = plan(roles, msgs, bool(opts.thinking), eff_drop, resume=resume)
        # Messages that render nothing (dropped developer messages) are still validated, as the
        # reference validates every message (the unchanged ones were, last turn).
        first_new = offset + u
        j0 = max(0, bisect.bisect_left(items, first_new, key=start) - 1) if u > 0 else 0
        covered = items[j0 - 1].end + 1 if j0 > 0 else 0
        for it in items[j0:]:
            for k in range(covered, it.start):
                if k >= offset and k >= first_new:
                    normalize_message(msgs[k], k - offset)
            covered = it.end + 1
        for k in range(covered, len(msgs)):
            if k >= offset and k >= first_new:
                normalize_message(msgs[k], k - offset)
        ctx_digest = _digest_obj([tools, rf]) if (tools or rf) else 0
        if not opts.template:
            raise RenderError("this lane has no chat template: only a message-level estimate is possible", None)
        template = load_template(opts.template)
        # Request indices: assistants below `reasoning_dropped_below` render without reasoning, developer
        # messages below `developer_dropped_below` are deleted (0: none).
        dropped = (max(0, drop_a - offset + 1) if drop_a >= 0 else 0, max(0, drop_d - offset) if drop_d >= 0 else 0)
        kept = 0
        if resume is not None and resume.used and pp is not None and pp.template is template and \
                pp.effort == effort and pp.ctx_digest == ctx_digest and pp.offset == offset and \
                pp.options.tokenizer_path == opts.tokenizer_path:
            kept = resume.used  # their render keys are the same too: template, effort, tools and offset agree
        return Prepared(opts, template, effort, tools, rf, offset, msgs, digests, items, ctx_digest, dropped,
                        roles, eff_drop, drop_a, kept)

    def _context(self, prep: Prepared, it: Item) -> dict:
        return {
            "m": _MARK,
            "f": _FM,
            "first": it.first,
            "effort": prep.effort if it.first else None,
            "tools": prep.tools if it.start == 0 else None,
            "rf": prep.response_format if it.start == 0 else None,
            "think": it.think,
            "header": it.header,
            "order": list(it.order),
        }

    def _item_key(self, prep: Prepared, it: Item) -> tuple:
        # The header is at _HEADER_AT (_reheader looks up the same key under another header).
        return (
            prep.template.key,
            it.role,
            tuple(prep.digests[it.start:it.end + 1]),
            it.first,
            prep.effort if it.first else None,
            prep.ctx_digest if it.start == 0 else 0,
            it.think,
            it.header,
            it.order,
        )

    def _call_macro(self, template: ChatTemplate, role: str, idx: int, members: list, c: dict) -> RenderedItem:
        if template.native is not None:  # the packaged template's macro in Python, for a plain item (native.py)
            plain = template.native(role, idx, members, c)
            if plain is not None:
                return _item(*plain)
        try:
            out = template.macro("render_item")(role, idx, members, c)
        except jinja2.TemplateError as e:
            raise _template_error(e) from None
        _, text, fields = _parse_marked(str(out))
        return _item(text, fields)

    def _render_items(self, prep: Prepared, previous: Previous | None = None,
                      ) -> tuple[list[ItemEntry], list[tuple], int]:
        r = prep.kept if previous is not None else 0
        held: list[ItemEntry] = []
        if r and not self.cache.touch_items(previous.keys[:r]):  # type: ignore[union-attr]
            # Some were evicted meanwhile: look up as without a previous turn, so the cache ends as the
            # full path leaves it; what it would render again is what the previous turn holds.
            held = prep.held = previous.entries[:r]  # type: ignore[union-attr]
            r = prep.kept = 0
        if r:
            # The kept items' keys and entries are last turn's (the same pure function of the same key);
            # their cache entries are touched as a lookup would, so evictions stay as they were.
            assert previous is not None
            keys = previous.keys[:r] + [self._item_key(prep, it) for it in prep.items[r:]]
            found = previous.entries[:r] + self.cache.get_items(keys[r:])
        else:
            keys = [self._item_key(prep, it) for it in prep.items]
            found = self.cache.get_items(keys)
        new: list[tuple[Any, ItemEntry]] = []
        tokenized: list[tuple[Any, ItemEntry]] = []  # derived items that came with their token ids
        tok_path = load_tokenizer(prep.options.tokenizer_path).path
        entry: ItemEntry | None
        for j in range(r, len(prep.items)):
            it = prep.items[j]
            if found[j] is not None:
                continue
            if j < len(held):  # the same key renders the same item: no need to run the template
                entry = ItemEntry(held[j].item)
                found[j] = entry
                new.append((keys[j], entry))
                continue
            if prep.template.header_is_suffix:
                entry = self._reheader(keys[j], tok_path)
                if entry is not None:  # the same item under another header, rendered before
                    found[j] = entry
                    new.append((keys[j], entry))
                    if entry.ids is not None:
                        tokenized.append((keys[j], entry))
                    continue
            said = prep.said
            if said is not None and it.role == "assistant" and it.start == it.end and not it.first and \
                    it.header is None and not it.think and it.start - prep.offset == said.index and \
                    said.template is prep.template and prep.template.reasoning_is_prefix:
                # The previous turn's answer sent back as history, rendered without its reasoning now
                # (dropped): derived from its render as the generated answer (no render, no tokenizer call).
                entry = _from_said(said, normalize_message(prep.msgs[it.start], said.index), tok_path)
                if entry is not None:
                    found[j] = entry
                    new.append((keys[j], entry))
                    if entry.ids is not None:
                        tokenized.append((keys[j], entry))
                    continue
            members = [
                m if k < prep.offset else normalize_message(m, k - prep.offset)
                for k, m in zip(range(it.start, it.end + 1), prep.msgs[it.start:it.end + 1])
            ]
            ri = self._call_macro(prep.template, it.role, it.start - prep.offset, members, self._context(prep, it))
            entry = ItemEntry(ri)
            found[j] = entry
            new.append((keys[j], entry))
        if new:
            self.cache.put_items(new)
        if tokenized:  # as _assemble keeps the ids of what it tokenizes: by text digest, and on the item
            self.cache.put_tokens([((tok_path, e.item.digest, len(e.item.text)), e.ids) for _, e in tokenized])
            self.cache.attach_tokens([(k, e, e.ids) for k, e in tokenized])
        return found, keys, len(new)  # type: ignore[return-value]

    def _reheader(self, key: tuple, tok_path: str) -> ItemEntry | None:
        """The item under `key` derived from a cached render of the same item under another generation
        header (the template's header only appends `<｜Assistant｜>` + header: template.header_is_suffix),
        with its token ids when that render has them (the header is special tokens, so the ids of the
        rest do not change). In an agent's conversation this is the previous user message, whose header
        turns from `<think>` to `</think>` once a newer user message follows: a macro call and a
        tokenizer call saved per turn (a large share of what a small agent turn costs).
        None when there is no such render."""
        header = key[_HEADER_AT]
        for other in HEADERS:
            if other == header:
                continue
            sibling = self.cache.peek_item(key[:_HEADER_AT] + (other,) + key[_HEADER_AT + 1:])
            if sibling is not None:
                return _with_header(sibling, other, header, tok_path)
        return None

    @staticmethod
    def _engine_cut(engine_ids: Sequence[int], tok: TextTokenizer, segments: list[Segment | None],
                    todo: list[tuple[int, str, list[int]]], need: list[int], ids: list) -> list[int]:
        """Fills `ids[j]` for the `need`ed texts from the engine's ids when that is cheaper than
        tokenizing them and they spell the render; returns what is left to tokenize."""
        chars = sum(len(todo[j][1]) for j in need)
        texts: list[str] = [s.text if s is not None else "" for s in segments]
        for pos, text, _ in todo:
            texts[pos] = text
        if chars < ENGINE_IDS_MIN_CHARS or chars * 2 < sum(map(len, texts)):
            return need  # a few new segments: tokenizing them costs less than spelling the whole prompt
        spelling = tok.spelling()
        cut = spelling.cut(engine_ids, texts, [todo[j][0] for j in need], tok) if spelling is not None else None
        if cut is None:
            return need
        for j, a in zip(need, cut):
            ids[j] = a
        return []

    def _touch_joined(self, groups: list[list[int]], segments: list, tok_path: str) -> None:
        """Segments of several items are looked up by their text's digest on every turn (below): do the
        same for the reused ones, so the cache ages as it would have."""
        multi = [segments[i] for i in _joined(groups)]
        if not multi:
            return
        joined = [(tok_path, seg.digest, len(seg.text)) for seg in multi]
        ids = self.cache.get_tokens(joined)
        missing = [(k, seg.token_ids) for k, v, seg in zip(joined, ids, multi) if v is None]
        if missing:
            self.cache.put_tokens(missing)

    def _assemble(self, prep: Prepared, entries: list[ItemEntry], keys: list[tuple], tok: TextTokenizer,
                  misses: int, previous: Previous | None = None, also: list | None = None,
                  engine_ids: Sequence[int] | None = None) -> Rendered:
        """`also`: [text] to tokenize in the same tokenizer call as the segments (the generated answer:
        one call a turn instead of two; a call's fixed cost, with the tokenizer's tables cold between
        turns, is most of a small text's); its ids are appended to the list. `engine_ids`: the ids the
        engine prefilled for this prompt, cut into the segments instead of tokenizing them where they
        spell the render (engine_ids.py)."""
        # Group items into segments; join an item to the previous one when their boundary is not a
        # special token (tokenization could then merge across it).
        groups: list[list[int]] = []
        segments: list[Segment | None] = []
        first = 0
        if previous is not None and prep.kept:
            # Last turn's segments made only of kept items, but the last of them (a new item could
            # join it); grouping restarts where a segment started, as it did last turn.
            reused = max(0, bisect.bisect_left(previous.groups, prep.kept, key=_last) - 1)
            if reused:
                groups = previous.groups[:reused]
                segments.extend(previous.segments[:reused])
                first = previous.groups[reused][0]
                self._touch_joined(groups, segments, tok.path)
        prev_end = True
        for j in range(first, len(entries)):
            e = entries[j]
            ri = e.item
            if not prev_end and not ri.starts_special:
                groups[-1].append(j)
            else:
                groups.append([j])
            prev_end = ri.ends_special
        off = prep.offset
        items = prep.items
        msgs = prep.msgs
        tok_path = tok.path
        todo: list[tuple[int, str, list[int]]] = []  # (segment position, text, group) to tokenize
        for g in groups[len(segments):]:
            it = items[g[0]]
            idx = it.start - off
            if len(g) == 1:
                e = entries[g[0]]
                seg = e.seg
                if seg is not None and seg.message_index == idx and e.ids is not None:
                    segments.append(seg)
                    continue
                if e.ids is not None:
                    ri = e.item
                    role = "prefix" if idx < 0 else msgs[it.start]["role"]
                    seg = Segment(idx, role, ri.text, e.ids, ri.fields, ri.digest, tuple(range(idx, it.end + 1 - off)))
                    e.seg = seg
                    segments.append(seg)
                    continue
                todo.append((len(segments), e.item.text, g))
            else:
                todo.append((len(segments), "".join(entries[j].item.text for j in g), g))
            segments.append(None)
        n_tok = cut = 0
        if todo:
            # Token ids by text digest (shared with other items and requests), then tokenize the rest.
            digests = [entries[g[0]].item.digest if len(g) == 1 else xxh64(t) for _, t, g in todo]
            tkeys = [(tok_path, d, len(t)) for d, (_, t, _) in zip(digests, todo)]
            ids = self.cache.get_tokens(tkeys)
            missing = [j for j, v in enumerate(ids) if v is None]
            if missing:
                need = missing
                if prep.held:  # ids the previous turn holds for the same text: no need to tokenize them
                    held_ids = {(e.item.digest, len(e.item.text)): e.ids for e in prep.held if e.ids is not None}
                    for j in missing:
                        ids[j] = held_ids.get((digests[j], len(todo[j][1])))
                    need = [j for j in missing if ids[j] is None]
                if engine_ids is not None and need:
                    left = self._engine_cut(engine_ids, tok, segments, todo, need, ids)
                    cut, need = len(need) - len(left), left
                texts = [todo[j][1] for j in need]
                if also:
                    texts.append(also[0])
                enc = tok.encode_batch(texts)
                if also:
                    also.append(enc.pop())
                for j, a in zip(need, enc):
                    ids[j] = a
                # The token table answers "ids of the segment with this digest" (drift comparison
                # reads it); single items also keep their ids on their entry (attach below). The
                # arrays are shared; the budget counts them in both places (conservative).
                self.cache.put_tokens([(tkeys[j], ids[j]) for j in missing])
            n_tok = len(missing) - cut
            attach = []
            for (pos, text, g), d, seg_ids in zip(todo, digests, ids):
                it = items[g[0]]
                idx = it.start - off
                role = "prefix" if idx < 0 else msgs[it.start]["role"]
                if len(g) == 1:
                    e = entries[g[0]]
                    seg = Segment(idx, role, text, seg_ids, e.item.fields, d, tuple(range(idx, it.end + 1 - off)))
                    e.seg = seg
                    attach.append((keys[g[0]], e, seg_ids))
                else:
                    fields: list[tuple[str, int, int]] = []
                    p = 0
                    for j in g:
                        ri = entries[j].item
                        fields.extend((n, s + p, x + p) for n, s, x in ri.fields)
                        p += len(ri.text)
                    indices = tuple(k - off for j in g for k in range(items[j].start, items[j].end + 1))
                    seg = Segment(idx, role, text, seg_ids, tuple(fields), d, indices)
                segments[pos] = seg
            if attach:
                self.cache.attach_tokens(attach)
        if also and len(also) == 1:  # nothing else to tokenize
            also.append(tok.encode(also[0]))
        out = Rendered(segments, True, misses, n_tok, cut)  # type: ignore[arg-type]
        # Segments lent by the previous render were made findable when it was assembled.
        self.cache.keep_findable(tok.path, segments, max(0, len(previous.segments) - 1) if previous else 0)
        out.dropped = prep.dropped
        out._provenance = Provenance(groups, entries, items, msgs, off)
        out.previous = Previous(prep, entries, keys, groups, segments)  # type: ignore[arg-type]
        return out


def _template_error(e: jinja2.TemplateError) -> RenderError:
    msg = str(e)
    head, sep, rest = msg.partition(": ")
    if sep and (head.startswith("messages[") or head.startswith("tools[") or head == "reasoning_effort"):
        return RenderError(rest, head)
    return RenderError(f"chat template error: {msg}", None)
