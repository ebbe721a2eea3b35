"""Take secrets out of text an upstream wrote before it reaches a client, a record or a log.

An engine's error message is arbitrary text: a misconfigured proxy in front of a replica may
echo the Authorization header it received ("invalid token sk-..."), a stack trace may quote an
environment. Everything the gateway passes on from an upstream error goes through `Scrubber.text`
(and the structured fields through `Scrubber.code`), which removes:

- the lane's own upstream key, whole or truncated to a long prefix;
- `Bearer <x>` / `Basic <x>` credentials and `key=value` pairs whose name says secret;
- key-like words: well-known key prefixes (sk-, ghp_, xoxb-, AKIA, eyJ... JWTs) and any long
  run of letters and digits mixed (24+ characters: hashes, tokens), which error messages never
  need to be useful.

Costs nothing on the success path: it runs only on error text.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
MAX_MESSAGE = 500  # characters of upstream error text passed on

# A value already redacted is left alone, and a bracketed value is taken whole: a second pass over a
# scrubbed text must not turn "[redacted]" into "[redacted]]".
_VALUE = r"""(?!\[redacted\])(?:\[[^\s\]]*\]|[^\s"',;&)}\]]+)"""
_CREDENTIAL = re.compile(r"\b(Bearer|Basic|Token)\s+" + _VALUE, re.IGNORECASE)
_NAMED = re.compile(
    r"""(?P<name>[\w.-]*(?:api[_-]?key|apikey|secrets?|token|password|passwd|authorization|credentials?))\b"""
    r"""(?P<sep>["']?\s*[:=]\s*["']?)(?P<value>""" + _VALUE + ")",
    re.IGNORECASE,
)
_PREFIXED = re.compile(
    r"\b(?:sk|pk|rk|ak)[-_][A-Za-z0-9_-]{6,}"  # OpenAI-style and many vendors
    r"|\b(?:ghp|gho|ghs|ghu|github_pat|glpat|hf|xox[abprs])[-_][A-Za-z0-9_-]{6,}"
    r"|\bAKIA[0-9A-Z]{12,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]+){0,2}"  # JWT
)
_LONG = re.compile(r"[A-Za-z0-9_+=-]{24,}")
_DIGIT = re.compile(r"\d")
_ALPHA = re.compile(r"[A-Za-z]")
_SAFE_CODE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _long_word(match: re.Match[str]) -> str:
    word = match.group(0)
    return REDACTED if _DIGIT.search(word) and _ALPHA.search(word) else word


class Scrubber:
    """Scrubs text for one lane; knows that lane's upstream key."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: list[str | None] | tuple[str | None, ...] = ()) -> None:
        found: list[str] = []
        for secret in secrets:
            if not secret:
                continue
            found.append(secret)
            if len(secret) >= 20:  # a message cut in the middle of the key still names it
                found.append(secret[:12])
        self._secrets = tuple(sorted(set(found), key=len, reverse=True))

    def text(self, text: str, limit: int = MAX_MESSAGE) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        text = _CREDENTIAL.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        text = _NAMED.sub(lambda m: m.group("name") + m.group("sep") + REDACTED, text)
        text = _PREFIXED.sub(REDACTED, text)
        text = _LONG.sub(_long_word, text)
        # Control characters would break logs and terminals; keep tabs and newlines.
        text = "".join(c if c.isprintable() or c in "\n\t" else " " for c in text)
        if len(text) > limit:
            text = text[:limit] + "…"
        return text

    def code(self, value: Any) -> str | int | None:
        """An error's `code`/`type`/`param`: a short identifier or a number, anything else dropped."""
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            return value if -(2**31) <= value < 2**31 else None
        if isinstance(value, str) and _SAFE_CODE.match(value) and self.text(value, 64) == value:
            return value
        return None
