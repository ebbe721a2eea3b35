"""A turn's cache verdict: what the analysis predicted of the engine's prefix cache, what the engine
reported, and why they differ. The analysis writes it (conversations/analysis.py); the shared prefix
model and the KV-event index refine it (prefixcache/, kvevents/); records, metrics, the access log,
alerts and the conversation's state read it. Its JSON (`to_json`) is what records, the state and the
admin API carry: its keys are the field names, an optional field only when it is set.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

VERDICTS = ("hit", "drift", "eviction", "cold", "unknown")


@dataclass(slots=True)
class KvNote:
    """What the replica's KV-event index said of the turn: the replica and its event stream's state;
    the index's explanation when it was asked (`evidence`, kvevents.verdict.Verdict's JSON), why it was
    not asked otherwise (`note`); the replica's pool pressure after the turn."""

    replica: str
    stream: str
    note: str | None = None
    evidence: Mapping[str, object] | None = None
    pressure: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"replica": self.replica, "stream": self.stream}
        if self.evidence is not None:
            out.update(self.evidence)
        if self.note is not None:
            out["note"] = self.note
        if self.pressure is not None:
            out["pressure"] = self.pressure
        return out


@dataclass(slots=True)
class CacheVerdict:
    """verdict: hit (the prediction held), drift (the prompt changed before the cached prefix ended:
    `cause` says how, `divergence_*` where), eviction (the engine served less than it held), cold (nothing
    to reuse: a new conversation, or it moved replica) or unknown (no analysis; `note` says why)."""

    verdict: str
    predicted_cached_tokens: int | None = None
    reported_cached_tokens: int | None = None
    cause: str | None = None
    divergence_message_index: int | None = None
    divergence_field: str | None = None
    lcp_tokens: int = 0  # tokens the render shares with the previous turn's
    tokens_lost: int = 0
    seconds_lost: float = 0.0  # tokens_lost at the lane's prefill rate
    rendered_prompt_tokens: int | None = None
    render: str = "none"  # exact (the lane's template) | estimated (no template) | none
    repinned: bool = False  # effort pinning put the conversation's effort back
    # Optional: set by the step that knows them.
    shared_prefix_tokens: int | None = None  # a first turn's prefix held from other conversations
    healed_tokens: dict[str, int] | None = None  # cached tokens each healing kind saved
    render_check: str | None = None  # token_ids (the engine's prompt ids compared) | count
    render_matches_engine: bool | None = None
    render_first_difference: int | None = None  # the first token where the render and the engine differ
    render_check_why: str | None = None  # why the engine gave no ids
    snippet_before: str | None = None  # a drift's text before and after its divergence
    snippet_after: str | None = None
    note: str | None = None
    kv: KvNote | None = None  # the KV-event index's explanation (gateway/kvevents)

    @classmethod
    def unknown(cls, why: str) -> "CacheVerdict":
        return cls("unknown", note=why)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "reported_cached_tokens": self.reported_cached_tokens, "verdict": self.verdict, "cause": self.cause,
            "divergence_message_index": self.divergence_message_index, "divergence_field": self.divergence_field,
            "lcp_tokens": self.lcp_tokens, "tokens_lost": self.tokens_lost, "seconds_lost": self.seconds_lost,
            "rendered_prompt_tokens": self.rendered_prompt_tokens, "render": self.render, "repinned": self.repinned,
        }
        for k, v in (("shared_prefix_tokens", self.shared_prefix_tokens), ("healed_tokens", self.healed_tokens),
                     ("render_check", self.render_check), ("render_matches_engine", self.render_matches_engine),
                     ("render_first_difference", self.render_first_difference),
                     ("render_check_why", self.render_check_why), ("snippet_before", self.snippet_before),
                     ("snippet_after", self.snippet_after), ("note", self.note)):
            if v is not None:
                out[k] = v
        if self.kv is not None:
            out["kv"] = self.kv.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CacheVerdict":
        """From `to_json`'s output (a state written by any version: unknown keys are left out)."""
        kv = d.get("kv")
        known = {k: v for k, v in d.items() if k in _FIELDS}
        known.setdefault("verdict", "unknown")
        for k, zero in (("lcp_tokens", 0), ("tokens_lost", 0), ("seconds_lost", 0.0), ("render", "none"),
                        ("repinned", False)):
            if known.get(k) is None:
                known[k] = zero
        out = cls(**known)
        if isinstance(kv, dict):
            out.kv = KvNote(str(kv.get("replica")), str(kv.get("stream")),
                            evidence={k: v for k, v in kv.items() if k not in ("replica", "stream", "pressure")},
                            pressure=kv.get("pressure"))
        return out


_FIELDS = frozenset(f.name for f in fields(CacheVerdict)) - {"kv"}  # what from_json takes as it is
