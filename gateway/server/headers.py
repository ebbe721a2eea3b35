"""Response header values: only what the gateway itself validated, never a client's bytes raw.

A header value with CR, LF or NUL would split the response; one outside latin-1 makes the ASGI
server raise after the upstream was already called. Values the gateway builds are checked here once,
at the end of the pipeline, whatever part wrote them; one that fails is dropped and logged, and the
answer goes out without it.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("gateway.headers")

MAX_VALUE = 512
_VISIBLE = re.compile(r"[\x20-\x7e]*")  # printable ASCII and space
_TOKEN = re.compile(r"[A-Za-z0-9_.+-]{1,32}")


def safe_value(name: str, value: object) -> str | None:
    """`value` as a header value when it is plain printable ASCII of sane length, else None (logged)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= MAX_VALUE and _VISIBLE.fullmatch(text):
        return text
    log.warning("response header %s dropped: its value is not plain printable ASCII (%d chars)", name, len(text))
    return None


def token(value: object, fallback: str = "other") -> str:
    """A client-supplied word or number as a header token: itself when it is one, else `fallback`."""
    if isinstance(value, bool):
        return fallback
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and _TOKEN.fullmatch(value):
        return value
    return fallback
