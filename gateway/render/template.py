"""Chat templates in a Hugging Face / vLLM compatible Jinja environment."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "chat_templates"


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


class ChatTemplate:
    """A compiled chat template plus direct access to its macros (thread-safe to share)."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.env = make_environment()
        self.template = self.env.from_string(source)
        # Executes the top level with no `messages`: nothing renders, the macros are exported.
        self.module = self.template.make_module({})

    def render(self, **variables: Any) -> str:
        return self.template.render(**variables)

    def macro(self, name: str):
        return getattr(self.module, name)


_lock = threading.Lock()
_templates: dict[str, ChatTemplate] = {}


def template_path(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".jinja" or p.is_absolute():
        return p if p.is_absolute() else TEMPLATE_DIR / p
    return TEMPLATE_DIR / f"{name}.jinja"


def load_template(name: str) -> ChatTemplate:
    """Load a template by name (file under chat_templates/ without .jinja) or path; cached."""
    with _lock:
        t = _templates.get(name)
        if t is None:
            path = template_path(name)
            t = ChatTemplate(name, path.read_text(encoding="utf-8"))
            _templates[name] = t
        return t
