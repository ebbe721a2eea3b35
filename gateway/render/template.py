"""Chat templates in a Hugging Face / vLLM compatible Jinja environment."""

from __future__ import annotations

import json
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import xxhash
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from . import native

# Templates ship inside the package (gateway/chat_templates/*.jinja, package data of the wheel) and are
# read through importlib.resources, never from a path beside the source tree.
PACKAGE = "gateway"
PACKAGED_DIR = "chat_templates"


class TemplateNotFound(ValueError):
    """A lane names a template that is neither packaged nor a readable file."""


class TemplateRaised(Exception):
    """raise_exception() was called by a template."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Same semantics as transformers' chat-template tojson (not Jinja's html-safe one).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_environment() -> ImmutableSandboxedEnvironment:
    """The environment transformers (and so vLLM) uses to render chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


# The last block of the `render_item` macro in the templates this gateway ships: the generation header
# an item carries when the model's turn follows it. When a template's macro ends with exactly this and
# reads `c.header` nowhere else, an item's render with one header is its render with another but for
# this suffix (see `header_is_suffix`).
HEADER_TRAILER = """  {%- if c.header -%}
    {{- F.generation_header ~ '<｜Assistant｜>' ~ c.header ~ F.e -}}
  {%- endif -%}
{%- endmacro -%}"""
HEADER_PREFIX = "<｜Assistant｜>"


def header_is_suffix(source: str) -> bool:
    """Does `render_item` read `c.header` only in its closing trailer (HEADER_TRAILER), so that the
    header only appends `<｜Assistant｜>` + header (a field `generation_header`) to the item? Checked
    on the source text: a template of another shape renders every header variant with the macro."""
    start = source.find("{%- macro render_item(")
    end = source.find(HEADER_TRAILER, start)
    if start < 0 or end < 0:
        return False
    if source.find("{%- endmacro", start) != end + HEADER_TRAILER.index("{%- endmacro"):
        return False  # the trailer must close render_item itself
    body = source[source.find("-%}", start) + 3:end]  # after the macro's signature
    # Every other use of the context `c` reads a named attribute other than `header` (no c['header'],
    # no c handed on whole to something that could read it).
    return all(m.group(1) not in (None, "header") for m in re.finditer(r"(?<![\w.])c\b(?:\.(\w+))?", body))


# The head of `render_item`'s assistant branch in the templates this gateway ships: with `c.think` the
# item starts with the reasoning and `</think>`, and nothing after reads the reasoning or the context.
ASSISTANT_HEAD = """  {%- elif role == 'assistant' -%}
    {%- set m = members[0] -%}
    {%- if c.think -%}
      {%- set rc = m['reasoning_content'] -%}
      {{- F.reasoning_content -}}{%- if rc -%}{{- rc -}}{%- endif -%}{{- F.e -}}
      {{- F.think_end ~ '</think>' ~ F.e -}}
    {%- endif -%}
"""


def reasoning_is_prefix(source: str) -> bool:
    """Does `render_item` render an assistant message (not the first item, no header) as the reasoning
    and `</think>` (only with `c.think`) followed by what its `content` and `tool_calls` alone make?
    Then the item without reasoning is the item with it, that prefix cut (renderer.py `_from_said`).
    Checked on the source: the branch starts with ASSISTANT_HEAD, is the macro's last, and the rest
    reads `m['content']` and `m['tool_calls']` and nothing else of the message or the context."""
    start = source.find("{%- macro render_item(")
    end = source.find(HEADER_TRAILER, start)
    if start < 0 or end < 0 or not header_is_suffix(source):
        return False
    head = source.find(ASSISTANT_HEAD, start, end)
    if head < 0:
        return False
    rest = source[head + len(ASSISTANT_HEAD):end]
    # The last branch: no other branch of the role's if (indented as this one) follows it.
    if re.search(r"\n {0,2}\{%-?\s*(elif|else)\b", rest) or "members" in rest or "role" in rest:
        return False
    if re.search(r"(?<![\w.])c\b", rest):
        return False
    return all(m.group(1) in ("content", "tool_calls")
               for m in re.finditer(r"(?<![\w.])m\b(?:\[\s*'(\w+)'\s*\])?", rest))


class ChatTemplate:
    """A compiled chat template plus direct access to its macros (thread-safe to share)."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        # What rendered items are cached under: the text, not the name (an edited file reloads under
        # the same name and must not reuse what the old text rendered).
        self.key = f"{name}\0{xxhash.xxh3_64_hexdigest(source.encode('utf-8', 'surrogatepass'))}"
        self.env = make_environment()
        self.template = self.env.from_string(source)
        # Executes the top level with no `messages`: nothing renders, the macros are exported.
        self.module = self.template.make_module({})
        self.header_is_suffix = header_is_suffix(source)
        self.reasoning_is_prefix = reasoning_is_prefix(source)
        self.native = native.for_source(source)  # render_item in Python for plain items, or None

    def render(self, **variables: Any) -> str:
        return self.template.render(**variables)

    def macro(self, name: str):
        return getattr(self.module, name)


_lock = threading.Lock()
_templates: dict[str, ChatTemplate] = {}


def packaged_templates() -> list[str]:
    """Names of the templates that ship with the gateway (`deepseek_v4.1`, ...)."""
    folder = resources.files(PACKAGE).joinpath(PACKAGED_DIR)
    return sorted(e.name.removesuffix(".jinja") for e in folder.iterdir() if e.name.endswith(".jinja"))


def is_file_reference(name: str) -> bool:
    """`deepseek_v4.1` names a packaged template; `./mine.jinja`, `t/x.jinja`, `/abs/x.jinja` name files."""
    return "/" in name or name.endswith(".jinja") or Path(name).is_absolute()


def resolve_template(name: str, base_dir: str | Path | None = None) -> str:
    """What a lane's `render.template` refers to: a packaged name as is, a file as an absolute path.

    A relative file is relative to `base_dir` (the folder of routes.yaml). Raises TemplateNotFound with a
    message fit for an operator (what was looked for, where, and what exists).
    """
    if not is_file_reference(name):
        if not resources.files(PACKAGE).joinpath(PACKAGED_DIR, f"{name}.jinja").is_file():
            raise TemplateNotFound(
                f"no packaged chat template {name!r} (packaged: {', '.join(packaged_templates()) or 'none'}); "
                "a template file of your own is a path ending in .jinja, relative to routes.yaml")
        return name
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise TemplateNotFound(f"chat template file {name!r} not found (looked for {path})")
    return str(path)


def template_path(name: str) -> Path:
    """A filesystem path of a template (for `vllm --chat-template` and messages); packaged or a file."""
    if is_file_reference(name):
        return Path(name)
    with resources.as_file(resources.files(PACKAGE).joinpath(PACKAGED_DIR, f"{name}.jinja")) as p:
        return Path(p)  # a real file in any installed wheel or checkout (no zip import here)


def template_source(name: str) -> str:
    """The text of a packaged template (by name) or of a template file (by path). Raises TemplateNotFound."""
    try:
        if is_file_reference(name):
            return Path(name).read_text(encoding="utf-8")
        return resources.files(PACKAGE).joinpath(PACKAGED_DIR, f"{name}.jinja").read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise TemplateNotFound(f"chat template {name!r} not found") from None


def load_template(name: str) -> ChatTemplate:
    """Load a template by packaged name (`deepseek_v4.1`) or file path (resolved: see resolve_template); cached.

    Raises TemplateNotFound, or jinja2.TemplateSyntaxError for a template that does not compile.
    """
    t = _templates.get(name)  # a packaged template loaded before (a file's key also holds its mtime)
    if t is not None:
        return t
    key = name
    if is_file_reference(name):
        try:  # an edited file (then a routes reload) must not keep serving the old compiled text
            st = Path(name).stat()
            key = f"{name}\0{st.st_mtime_ns}\0{st.st_size}"
        except OSError:
            raise TemplateNotFound(f"chat template file {name!r} not found") from None
    with _lock:
        t = _templates.get(key)
        if t is None:
            t = ChatTemplate(name, template_source(name))
            _templates[key] = t
        return t
