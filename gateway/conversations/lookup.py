"""Find a conversation by what a reviewer has: the gateway's id, or the client's own key.

Clients name their sessions (`X-Conversation-Id`, `prompt_cache_key`, `user`); the gateway never
keeps those keys, only `identity.key_id(key)`. A reviewer told "my agent's session abc is slow" types
`abc`: it is hashed the same way here and looked up within the tenant (records carry the tenant).
"""

from __future__ import annotations

import re

from .identity import DEFAULT_TENANT, key_id

INTERNAL = re.compile(r"^[kc][0-9a-f]{16}$")  # key_id ("k" + xxh64) and lineage ids ("c" + uuid part)


def candidate_ids(key: str, tenant: str = DEFAULT_TENANT) -> list[str]:
    """Conversation ids `key` may mean, most likely first: the id itself, then the client's key
    hashed within `tenant` exactly as the hot path does (identity.key_id)."""
    key = key.strip()
    if not key:
        return []
    out = [key] if INTERNAL.match(key) else []
    hashed = key_id(key, tenant or DEFAULT_TENANT)
    if hashed not in out:
        out.append(hashed)
    return out
