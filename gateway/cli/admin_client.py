"""A tiny client for a running gateway's admin JSON APIs (used by `gateway stats` and `gateway drift`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def get_json(base_url: str, path: str, query: dict[str, str], key: str | None, timeout: float = 30.0) -> Any:
    url = base_url.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - an admin-given URL
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise OSError(f"{base_url} answered HTTP {exc.code}: {exc.read()[:300].decode('utf-8', 'replace')}") from None


def send_json(base_url: str, method: str, path: str, body: Any | None, key: str | None,
              timeout: float = 30.0) -> Any:
    """POST/DELETE a JSON body to an admin API; an HTTP error becomes an OSError with the answer."""
    url = base_url.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - an admin-given URL
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise OSError(f"{base_url} answered HTTP {exc.code}: {exc.read()[:300].decode('utf-8', 'replace')}") from None
