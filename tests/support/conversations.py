"""Waiting for the gateway's analysis of a conversation turn (it runs after the response)."""

from __future__ import annotations

import time

import httpx


def wait_analysed(gw, cid: str, turn: int, timeout: float = 30.0, headers: dict | None = None) -> dict:
    """The conversation's admin view once `turn` has been analysed (`headers`: e.g. the admin key)."""
    deadline = time.monotonic() + timeout
    r = None
    while time.monotonic() < deadline:
        r = httpx.get(f"{gw.url}/admin/conversations/{cid}", headers=headers)
        if r.status_code == 200 and r.json()["turn"] >= turn:
            return r.json()
        time.sleep(0.02)
    detail = r.text[:500] if r is not None else ""
    raise AssertionError(f"turn {turn} of {cid} was not analysed in time: {detail}\n{gw.log()[-3000:]}")
