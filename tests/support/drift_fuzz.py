"""Labelled-mutation fuzzing of the drift classifier (tests/test_drift_fuzz.py, `make fuzz-drift`).

Hypothesis builds a realistic two-turn conversation (system and developer messages, tools or none,
thinking on and off, drop on and off, parallel tool calls with merged results, images, non-English
text, effort as a word or a number, vLLM or SGLang message reading), then applies one mutation from
`MUTATIONS` to the second turn. Each mutation carries its label: the cause it must produce (or
"stable" for a neutral one) given the scenario. The label, never the classifier's code, gives the
expected cause; the expected message index comes from the template's own item markers in the new
render; stable <=> turn 2's prompt starts with turn 1's prompt + generated text.
"""

from __future__ import annotations

import copy
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import strategies as st

from gateway.conversations.analysis import _tokens_of, char_offset, new_turn, turn_print
from gateway.conversations.drift import classify, common_prefix, compare
from gateway.render.checks import effective_effort
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions

WORDS = ["build", "the", "parser", "файл", "テスト", "données", "naïve", "42", "src/app.py", "Ω", "quickly",
         "café", "数据", "déjà", "vu", "x=1", "README", "🙂", "über", "tests"]
EFFORT_WORDS = ["low", "high", "xhigh", "max"]
EFFORT_NUMBERS = {"low": 25, "high": 50, "xhigh": 75, "max": 100}
TOOL_NAMES = ["read_file", "run_shell", "search_code"]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.test/a.png"}}
RESPONSE_FORMATS = [{"type": "json_object"}, {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def text(draw: Callable, lo: int = 1, hi: int = 5) -> str:
    # One integer draw per text (a list strategy costs ~7 ms an example): the words come from its digits.
    seed = draw(st.integers(0, 2**40))
    n = lo + seed % (hi - lo + 1)
    seed //= hi - lo + 1
    out = []
    for _ in range(n):
        out.append(WORDS[seed % len(WORDS)])
        seed //= len(WORDS)
    return " ".join(out)


def tool(name: str, desc: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}}}


@dataclass
class Scenario:
    engine: str
    thinking: bool
    drop: bool
    effort: Any
    tools: list[dict[str, Any]] | None
    turn1: list[dict[str, Any]]
    output: dict[str, Any]  # the assistant message turn 1 generated (reasoning_content, content, tool_calls)
    tail: list[dict[str, Any]]  # what the client appends after the output in turn 2
    ids: bool  # tool results carry tool_call_id
    response_format: dict[str, Any] | None = None
    # turn 2 overrides, set by a mutation
    turn2: list[dict[str, Any]] = field(default_factory=list)
    tools2: Any = "same"
    effort2: Any = "same"
    thinking2: Any = "same"
    response_format2: Any = "same"

    @property
    def eff_drop(self) -> bool:
        return self.thinking and self.drop and not self.tools

    def body(self, turn: int) -> dict[str, Any]:
        if turn == 1:
            return {"messages": self.turn1, "tools": self.tools, "response_format": self.response_format}
        tools = self.tools if self.tools2 == "same" else self.tools2
        rf = self.response_format if self.response_format2 == "same" else self.response_format2
        return {"messages": self.turn2, "tools": tools, "response_format": rf}

    def options(self, turn: int) -> RenderOptions:
        effort = self.effort if turn == 1 or self.effort2 == "same" else self.effort2
        thinking = self.thinking if turn == 1 or self.thinking2 == "same" else self.thinking2
        return RenderOptions(thinking=thinking, reasoning_effort=effort, drop_thinking=self.drop, engine=self.engine)


def _calls(draw: Callable, n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        keys = draw(st.lists(st.sampled_from(["path", "n", "mode", "query"]), min_size=1, max_size=3, unique=True))
        args = {k: (draw(st.integers(0, 99)) if k == "n" else text(draw, 1, 2)) for k in keys}
        out.append({"id": "call_" + secrets.token_hex(3), "type": "function",
                    "function": {"name": draw(st.sampled_from(TOOL_NAMES)), "arguments": json.dumps(args)}})
    return out


def _results(draw: Callable, calls: list[dict[str, Any]], ids: bool) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        m: dict[str, Any] = {"role": "tool", "content": text(draw, 1, 4)}
        if ids:
            m["tool_call_id"] = c["id"]
        out.append(m)
    return out


@st.composite
def scenarios(draw: Callable) -> Scenario:
    engine = draw(st.sampled_from(["sglang", "vllm"]))
    thinking = draw(st.booleans())
    drop = draw(st.booleans())
    effort = draw(st.one_of(st.none(), st.sampled_from(EFFORT_WORDS), st.integers(1, 100)))
    tools = None
    if draw(st.booleans()):
        tools = [tool(n, text(draw, 1, 3)) for n in draw(st.lists(st.sampled_from(TOOL_NAMES), min_size=1,
                                                                     max_size=3, unique=True))]
    ids = draw(st.booleans()) if tools else True
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": text(draw, 2, 6)})
    if draw(st.integers(0, 3)) == 0:
        msgs.append({"role": "developer", "content": text(draw, 1, 4)})
    for _ in range(draw(st.integers(0, 1))):  # an earlier exchange
        msgs.append({"role": "user", "content": text(draw)})
        if tools and draw(st.booleans()):
            calls = _calls(draw, draw(st.integers(1, 2)))
            msgs.append({"role": "assistant", "content": "", "reasoning_content": text(draw), "tool_calls": calls})
            msgs.extend(_results(draw, calls, ids))
        msgs.append({"role": "assistant", "content": text(draw), "reasoning_content": text(draw)})
    if draw(st.booleans()):
        msgs.append({"role": "user", "content": [{"type": "text", "text": text(draw)}, IMAGE]})
    else:
        msgs.append({"role": "user", "content": text(draw)})
    output: dict[str, Any] = {"reasoning_content": text(draw) if thinking else None, "content": text(draw)}
    if tools and draw(st.booleans()):
        output["tool_calls"] = _calls(draw, draw(st.integers(1, 2)))
        output["content"] = ""
        tail = _results(draw, output["tool_calls"], ids)
    else:
        output["tool_calls"] = None
        tail = [{"role": "user", "content": text(draw)}]
    s = Scenario(engine, thinking, drop, effort, tools, msgs, output, tail, ids)
    if draw(st.integers(0, 3)) == 0:  # SGLang's template renders it; vLLM's never sees it
        s.response_format = draw(st.sampled_from(RESPONSE_FORMATS))
    s.turn2 = [*copy.deepcopy(msgs), sent_back(output), *copy.deepcopy(tail)]
    return s


def sent_back(output: dict[str, Any]) -> dict[str, Any]:
    """The generated message as an agent appends it (the fields the gateway relayed)."""
    m: dict[str, Any] = {"role": "assistant", "content": output["content"]}
    if output.get("reasoning_content"):
        m["reasoning_content"] = output["reasoning_content"]
    if output.get("tool_calls"):
        m["tool_calls"] = copy.deepcopy(output["tool_calls"])
    return m


# ------------------------------------------------------------------------------------------------
# The catalogue: name -> (applies(scenario), mutate(scenario, draw), label(scenario))
# ------------------------------------------------------------------------------------------------

Mutation = tuple[Callable[[Scenario], bool], Callable[[Scenario, Callable], None], Callable[[Scenario], str]]
MUTATIONS: dict[str, Mutation] = {}
LABELS: dict[str, set[str]] = {}  # the labels each mutation can carry (for the coverage check)
STABLE = "stable"


def mutation(name: str, applies: Callable[[Scenario], bool], label: str | Callable[[Scenario], str],
             labels: set[str] | None = None):
    def deco(fn: Callable[[Scenario, Callable], None]):
        MUTATIONS[name] = (applies, fn, label if callable(label) else (lambda s, lab=label: lab))
        LABELS[name] = labels or ({label} if isinstance(label, str) else {STABLE, "reasoning_dropped_by_template"})
        return fn
    return deco


def _echo(s: Scenario) -> dict[str, Any]:
    return s.turn2[len(s.turn1)]


def _baseline(s: Scenario) -> str:
    # Without tools, thinking + drop: the template drops the output's reasoning as a user message arrives.
    return "reasoning_dropped_by_template" if s.eff_drop else STABLE


def _rendered_reasoning(s: Scenario) -> bool:
    return s.thinking and not s.eff_drop and bool(s.output.get("reasoning_content"))


def _indices(s: Scenario, role: str, before_output: bool = True) -> list[int]:
    n = len(s.turn1) if before_output else len(s.turn2)
    return [i for i in range(n) if s.turn2[i]["role"] == role]


ALWAYS = lambda s: True  # noqa: E731
LATE_OK = lambda s: not s.eff_drop  # noqa: E731  mutations after the drop point only where nothing drops


# -- neutral: the engine renders the same prompt ---------------------------------------------------

@mutation("none", ALWAYS, _baseline)
def _none(s, draw):
    pass


@mutation("content_as_one_part", lambda s: any(isinstance(m["content"], str) and m["role"] == "user"
                                               for m in s.turn2), _baseline)
def _content_parts(s, draw):
    i = draw(st.sampled_from([i for i, m in enumerate(s.turn2)
                              if m["role"] == "user" and isinstance(m["content"], str)]))
    s.turn2[i]["content"] = [{"type": "text", "text": s.turn2[i]["content"]}]


@mutation("name_added", ALWAYS, _baseline)
def _name(s, draw):
    draw(st.sampled_from(s.turn2))["name"] = "agent-7"


@mutation("unknown_field_added", ALWAYS, _baseline)
def _extra(s, draw):
    draw(st.sampled_from(s.turn2))["metadata"] = {"trace": "abc"}


@mutation("arguments_whitespace", lambda s: bool(s.output.get("tool_calls")), _baseline)
def _args_ws(s, draw):
    for tc in _echo(s)["tool_calls"]:
        tc["function"]["arguments"] = json.dumps(json.loads(tc["function"]["arguments"]), indent=2)


@mutation("arguments_as_object", lambda s: bool(s.output.get("tool_calls")), _baseline)
def _args_obj(s, draw):
    for tc in _echo(s)["tool_calls"]:
        tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])


@mutation("tool_call_type_dropped", lambda s: bool(s.output.get("tool_calls")), _baseline)
def _tc_type(s, draw):
    for tc in _echo(s)["tool_calls"]:
        tc.pop("type", None)


@mutation("empty_tool_calls_list", lambda s: not s.output.get("tool_calls"), _baseline)
def _empty_tcs(s, draw):
    _echo(s)["tool_calls"] = []


@mutation("tool_calls_content_null", lambda s: bool(s.output.get("tool_calls")), _baseline)
def _content_null(s, draw):
    _echo(s)["content"] = None


@mutation("image_url_changed", lambda s: any(isinstance(m["content"], list) for m in s.turn1), _baseline)
def _image_url(s, draw):
    for m in s.turn2:
        if isinstance(m["content"], list):
            for p in m["content"]:
                if p.get("type") == "image_url":
                    p["image_url"] = {"url": "data:image/png;base64,AAAA"}


@mutation("effort_same_number_other_spelling", lambda s: isinstance(s.effort, str) or s.effort is None, _baseline)
def _effort_spelling(s, draw):
    s.effort2 = EFFORT_NUMBERS[s.effort or "high"]


@mutation("effort_changed_in_chat_mode", lambda s: not s.thinking, _baseline)
def _effort_chat(s, draw):
    s.effort2 = draw(st.integers(1, 100))


@mutation("tool_results_reordered_with_ids", lambda s: s.ids and len(s.tail) > 1 and s.tail[0]["role"] == "tool",
          _baseline)
def _results_ids(s, draw):
    n = len(s.turn1) + 1
    s.turn2[n:] = list(reversed(s.turn2[n:]))


@mutation("reasoning_sent_as_reasoning_field", lambda s: bool(s.output.get("reasoning_content")),
          lambda s: "client_stripped_reasoning" if s.engine == "sglang" and _rendered_reasoning(s) else _baseline(s),
          {"client_stripped_reasoning", STABLE, "reasoning_dropped_by_template"})
def _reasoning_field(s, draw):
    # vLLM streams reasoning as `reasoning`; an agent sends it back under that name. vLLM renders it,
    # SGLang's protocol has no such field (the reasoning is lost from the prompt).
    m = _echo(s)
    m["reasoning"] = m.pop("reasoning_content")


@mutation("reasoning_stripped_in_chat_mode", lambda s: not s.thinking and any(
    m.get("reasoning_content") for m in s.turn2), _baseline)
def _strip_chat(s, draw):
    for m in s.turn2:
        m.pop("reasoning_content", None)


@mutation("response_format_top_level_vllm", lambda s: s.engine == "vllm", _baseline)
def _rf_vllm(s, draw):
    # vLLM never hands it to the template: added, removed or replaced, the prompt is the same.
    s.response_format2 = None if s.response_format else {"type": "json_object"}


# -- causes ------------------------------------------------------------------------------------------

@mutation("effort_changed", lambda s: s.thinking, "effort_changed")
def _effort(s, draw):
    current = EFFORT_NUMBERS.get(s.effort or "high", s.effort) if not isinstance(s.effort, int) else s.effort
    s.effort2 = draw(st.integers(1, 100).filter(lambda v: v != current))


@mutation("thinking_toggled", ALWAYS, "thinking_toggled")
def _thinking(s, draw):
    s.thinking2 = not s.thinking


@mutation("system_prompt_changed", lambda s: s.turn1[0]["role"] == "system", "system_prompt_changed")
def _system(s, draw):
    s.turn2[0]["content"] += " Today is 2026-12-01 11:41."


@mutation("tools_reordered", lambda s: bool(s.tools) and len(s.tools) > 1, "tools_changed")
def _tools_order(s, draw):
    s.tools2 = list(reversed(s.tools))


@mutation("tools_added", lambda s: not s.tools, "tools_changed")
def _tools_added(s, draw):
    s.tools2 = [tool("run_shell", "Run a command.")]


@mutation("tools_removed", lambda s: bool(s.tools) and not any(m.get("tool_calls") for m in s.turn2),
          "tools_changed")
def _tools_removed(s, draw):
    s.tools2 = None


@mutation("tool_description_edited", lambda s: bool(s.tools), "tools_changed")
def _tools_edit(s, draw):
    s.tools2 = copy.deepcopy(s.tools)
    s.tools2[-1]["function"]["description"] += " (v2)"


@mutation("effort_removed", lambda s: s.thinking and s.effort is not None,
          lambda s: _baseline(s) if effective_effort(RenderOptions(thinking=True, reasoning_effort=s.effort))
          == effective_effort(RenderOptions(thinking=True)) else "effort_changed",
          {"effort_changed", STABLE, "reasoning_dropped_by_template"})
def _effort_removed(s, draw):
    s.effort2 = None


@mutation("tools_removed_after_calls", lambda s: bool(s.tools) and any(m.get("tool_calls") for m in s.turn2),
          "tools_changed")
def _tools_removed_calls(s, draw):
    s.tools2 = None  # the history keeps its tool calls and results


@mutation("response_format_added", lambda s: s.engine == "sglang" and not s.response_format, "response_format_changed")
def _rf(s, draw):
    s.response_format2 = {"type": "json_object"}


@mutation("response_format_removed", lambda s: s.engine == "sglang" and bool(s.response_format),
          "response_format_changed")
def _rf_removed(s, draw):
    s.response_format2 = None


@mutation("response_format_replaced", lambda s: s.engine == "sglang" and bool(s.response_format),
          "response_format_changed")
def _rf_replaced(s, draw):
    s.response_format2 = next(rf for rf in RESPONSE_FORMATS if rf != s.response_format)


@mutation("client_stripped_reasoning", _rendered_reasoning, "client_stripped_reasoning")
def _strip(s, draw):
    _echo(s).pop("reasoning_content")


@mutation("reasoning_edited", _rendered_reasoning, "history_edited")
def _reasoning_edit(s, draw):
    _echo(s)["reasoning_content"] += " (summarised)"


@mutation("output_content_edited", lambda s: LATE_OK(s) and bool(s.output["content"]), "history_edited")
def _content_edit(s, draw):
    _echo(s)["content"] += " [edited]"


@mutation("earlier_user_edited", lambda s: LATE_OK(s) and len(_indices(s, "user")) > 1, "history_edited")
def _user_edit(s, draw):
    i = _indices(s, "user")[0]
    c = s.turn2[i]["content"]
    s.turn2[i]["content"] = (c + " (edited)") if isinstance(c, str) else [*c, {"type": "text", "text": "(edited)"}]


@mutation("arguments_keys_reordered", lambda s: LATE_OK(s) and any(
    len(json.loads(tc["function"]["arguments"])) > 1 for tc in (s.output.get("tool_calls") or [])), "history_edited")
def _args_order(s, draw):
    for tc in _echo(s)["tool_calls"]:
        args = json.loads(tc["function"]["arguments"])
        tc["function"]["arguments"] = json.dumps(dict(reversed(list(args.items()))))


@mutation("tool_result_edited", lambda s: LATE_OK(s) and any(m["role"] == "tool" for m in s.turn1), "history_edited")
def _result_edit(s, draw):
    i = _indices(s, "tool")[0]
    s.turn2[i]["content"] += " (truncated)"


@mutation("tool_results_reordered_without_ids", lambda s: not s.ids and len(s.tail) > 1 and s.tail[0]["role"] == "tool"
          and s.tail[0]["content"] != s.tail[1]["content"], "stable")
def _results_no_ids(s, draw):
    # Appended results are new text: reordering them changes nothing already cached.
    n = len(s.turn1) + 1
    s.turn2[n:] = list(reversed(s.turn2[n:]))


@mutation("earlier_results_reordered_without_ids", lambda s: LATE_OK(s) and _earlier_group(s, False) is not None,
          "history_edited")
def _earlier_results(s, draw):
    a, b = _earlier_group(s, False)  # type: ignore[misc]
    s.turn2[a:b] = list(reversed(s.turn2[a:b]))


@mutation("earlier_results_reordered_with_ids", lambda s: _earlier_group(s, True) is not None, _baseline)
def _earlier_results_ids(s, draw):
    a, b = _earlier_group(s, True)  # type: ignore[misc]
    s.turn2[a:b] = list(reversed(s.turn2[a:b]))


@mutation("earlier_results_reordered_call_ids_missing", lambda s: LATE_OK(s) and _earlier_group(s, True) is not None,
          "tool_results_reordered")
def _earlier_results_unmatched(s, draw):
    # Results carry ids but the assistant's calls lost theirs: nothing to sort by, the client's order counts.
    a, b = _earlier_group(s, True)  # type: ignore[misc]
    for tc in s.turn2[a - 1]["tool_calls"]:
        tc.pop("id", None)
    s.turn2[a:b] = list(reversed(s.turn2[a:b]))


def _earlier_group(s: Scenario, ids: bool) -> tuple[int, int] | None:
    i = 0
    while i < len(s.turn1):
        if s.turn1[i]["role"] == "tool":
            j = i
            while j < len(s.turn1) and s.turn1[j]["role"] == "tool":
                j += 1
            if j - i > 1 and ids == s.ids and s.turn1[i]["content"] != s.turn1[j - 1]["content"]:
                return i, j
            i = j
        else:
            i += 1
    return None


@mutation("image_removed", lambda s: LATE_OK(s) and any(isinstance(m["content"], list) for m in s.turn1),
          "image_removed")
def _image_removed(s, draw):
    for m in s.turn2:
        if isinstance(m["content"], list):
            m["content"] = [p for p in m["content"] if p.get("type") != "image_url"]
            break


@mutation("exchange_compacted", lambda s: LATE_OK(s) and _earlier_exchange(s) is not None, "history_edited")
def _compact(s, draw):
    a, b = _earlier_exchange(s)  # type: ignore[misc]
    del s.turn2[a:b]


def _earlier_exchange(s: Scenario) -> tuple[int, int] | None:
    users = _indices(s, "user")
    if len(users) < 2:
        return None
    return users[0], users[1]


@mutation("regenerated", ALWAYS, "regenerated")
def _regenerated(s, draw):
    s.turn2 = copy.deepcopy(s.turn1)


# ------------------------------------------------------------------------------------------------
# One example
# ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    label: str
    stable: bool
    expected_stable: bool
    cause: str | None
    index: int | None
    expected_index: int | None
    lcp: int
    expected_lcp: int
    position: int | None = None  # the first character where the new render leaves the old one (None: stable)
    labels: frozenset[str] = frozenset()  # other causes accepted (two edits meeting at one character)

    def mismatch(self) -> str | None:
        if self.stable != self.expected_stable:
            return f"{self.name}: stable={self.stable}, renders say {self.expected_stable}"
        if self.lcp != self.expected_lcp:
            return f"{self.name}: lcp {self.lcp} != {self.expected_lcp}"
        want = STABLE if self.expected_stable else self.label
        got = STABLE if self.stable else self.cause
        if got != want and got not in self.labels:
            return f"{self.name}: cause {got!r}, label {want!r}"
        if not self.stable and self.cause != "regenerated" and self.index != self.expected_index:
            return f"{self.name}: index {self.index}, renders say {self.expected_index}"
        return None


_MARK = "\x00" + secrets.token_hex(4) + "\x00"


def _item_starts(renderer: Renderer, body: dict[str, Any], opts: RenderOptions) -> list[tuple[int, int]]:
    """(char position, message index) of each item in the template's own render (its segment markers)."""
    marked = renderer.render_template(body, opts, segment_marker=_MARK)
    parts = marked.split(_MARK)
    out, pos = [], 0
    for j, p in enumerate(parts):
        if j % 2 == 0:
            pos += len(p)
        elif p.startswith("s"):
            out.append((pos, int(p[1:])))
    return out


def run(renderer: Renderer, s: Scenario, name: str, label: str | None = None) -> Outcome:
    """The classifier on scenario `s` (already mutated by `name`), against the label (the mutation's, or
    `label` when given: a combination's) and what the two renders say."""
    o1, o2 = s.options(1), s.options(2)
    b1, b2 = s.body(1), s.body(2)
    r1 = renderer.render(b1, o1)
    gen = renderer.render_generated(b1, s.output, o1)
    e1 = effective_effort(RenderOptions(thinking=True, reasoning_effort=o1.reasoning_effort))
    e2 = effective_effort(RenderOptions(thinking=True, reasoning_effort=o2.reasoning_effort))
    old = turn_print(new_turn(b1, o1.thinking, e1, engine=s.engine), r1, gen, s.output, 0, engine=s.engine)
    r2 = renderer.render(b2, o2)
    tokens_of = _tokens_of(renderer, o2)
    cmp = compare(old, r2, tokens_of)
    old_text = r1.prompt + gen.text
    new_text = r2.prompt
    expected_stable = new_text.startswith(old_text)
    expected_lcp = common_prefix([*r1.token_ids, *gen.token_ids], r2.token_ids)
    p = None if expected_stable else next((k for k, (a, b) in enumerate(zip(old_text, new_text)) if a != b),
                                          min(len(old_text), len(new_text)))
    cause = index = expected_index = None
    if not cmp.stable:
        div = classify(old, new_turn(b2, o2.thinking, e2, engine=s.engine), r2, cmp,
                       char_offset(r2, cmp, o2, old, tokens_of))
        cause, index = div.cause, div.message_index
        starts = _item_starts(renderer, b2, o2)
        expected_index = max(0, next((idx for pos, idx in reversed(starts) if pos <= (p or 0)), 0))
    return Outcome(name, label if label is not None else MUTATIONS[name][2](s), cmp.stable, expected_stable, cause,
                   index, expected_index, cmp.lcp_tokens, expected_lcp, p)


# ------------------------------------------------------------------------------------------------
# Two edits in one turn
# ------------------------------------------------------------------------------------------------

# Mutations that compose: each keeps the message positions the others index by (compaction and a
# regenerated turn move them) and draws only numbers, so a combination can replay its draws.
COMBINABLE = sorted(set(MUTATIONS) - {"name_added", "unknown_field_added", "regenerated", "exchange_compacted"})
# Mutations of one part that do not compose (both set the effort, both rewrite the same arguments...):
# a pair takes its two from different groups.
_GROUPS = [
    {"arguments_whitespace", "arguments_as_object", "arguments_keys_reordered", "tool_call_type_dropped"},
    {"reasoning_sent_as_reasoning_field", "client_stripped_reasoning", "reasoning_edited",
     "reasoning_stripped_in_chat_mode"},
    {"effort_changed", "effort_same_number_other_spelling", "effort_changed_in_chat_mode", "effort_removed"},
    {"tools_reordered", "tools_added", "tools_removed", "tools_removed_after_calls", "tool_description_edited"},
    {"response_format_added", "response_format_removed", "response_format_replaced",
     "response_format_top_level_vllm"},
    {"tool_results_reordered_with_ids", "tool_results_reordered_without_ids"},
    {"earlier_results_reordered_without_ids", "earlier_results_reordered_with_ids",
     "earlier_results_reordered_call_ids_missing", "tool_result_edited"},
    {"content_as_one_part", "earlier_user_edited", "image_removed", "image_url_changed"},
]
GROUP = {name: i for i, g in enumerate(_GROUPS) for name in g}


def composes(a: str, b: str) -> bool:
    return a != b and GROUP.get(a, a) != GROUP.get(b, b)


class Replay:
    """A `draw` that records what a mutation drew, then gives the same values again."""

    def __init__(self, draw: Callable) -> None:
        self.draw, self.values, self.at = draw, [], None

    def __call__(self, strategy: Any, label: str | None = None) -> Any:
        if self.at is None:
            v = self.draw(strategy)
            self.values.append(v)
            return v
        v = self.values[self.at]
        self.at += 1
        return v

    def again(self) -> "Replay":
        self.at = 0
        return self


def run_pair(renderer: Renderer, s: Scenario, a: str, b: str, draw: Callable) -> Outcome:
    """Mutations `a` then `b` on one turn. The label is read from each alone: the cause of the one whose
    difference comes first in render order; where the other's own difference starts no later than the
    pair's break (both edits at the same character, one side's text against the other's), either."""
    da, db = Replay(draw), Replay(draw)
    sa, sb, both = copy.deepcopy(s), copy.deepcopy(s), copy.deepcopy(s)
    MUTATIONS[a][1](sa, da)
    MUTATIONS[b][1](sb, db)
    MUTATIONS[a][1](both, da.again())
    MUTATIONS[b][1](both, db.again())
    singles = sorted((o for o in (run(renderer, sa, a), run(renderer, sb, b)) if not o.expected_stable),
                     key=lambda o: o.position)  # type: ignore[arg-type, return-value]
    if not singles:
        return run(renderer, both, f"{a}+{b}", STABLE)
    pair = run(renderer, both, f"{a}+{b}", singles[0].label)
    pair.labels = frozenset(o.label for o in singles[1:] if pair.position is not None and o.position <= pair.position)
    return pair
