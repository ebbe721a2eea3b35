"""Find a conversation by what a reviewer has: the gateway's id, or the client's own key.

Clients name their sessions (`X-Conversation-Id`, `prompt_cache_key`, `user`); the gateway never
keeps those keys, only `identity.key_id(key)`. A reviewer told "my agent's session abc is slow" types
`abc`: it is hashed the same way here and looked up within the tenant (records carry the tenant).
"""

from __future__ import annotations

import re

from .identity import key_id

INTERNAL = re.compile(r"^[kc][0-9a-f]{16}$")  # key_id ("k" + xxh64) and lineage ids ("c" + uuid part)


def candidate_ids(key: str) -> list[str]:
    """Conversation ids `key` may mean, most likely first."""
    key = key.strip()
    if not key:
        return []
    out = [key] if INTERNAL.match(key) else []
    hashed = key_id(key)
    if hashed not in out:
        out.append(hashed)
    return out
