"""`gateway check --probe`: ask each replica what it serves (GET /v1/models) and compare with its lane.

Both engines answer with OpenAI model cards (shared/fixtures/upstream/FACTS.md §7): `id` is the served
name, `max_model_len` the context window, `root` the model path (vLLM) or the served name (SGLang), and
`owned_by` the engine. The lane must name a model the replica serves, must not admit more context than
the engine accepts, and a configured `revision` must be what the replica reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.config import Lane


@dataclass
class Finding:
    key: str  # routes.yaml key path under the lane, e.g. "limits.max_context_tokens"
    message: str
    severity: str = "mismatch"  # "mismatch" (check fails), "unreachable" (check fails), "note"


@dataclass
class ReplicaReport:
    url: str
    served: list[str] = field(default_factory=list)
    card: dict[str, Any] | None = None  # the card of the lane's upstream_model
    findings: list[Finding] = field(default_factory=list)

    @property
    def revision(self) -> str | None:
        root = (self.card or {}).get("root")
        return str(root) if root else None


def probe_replica(lane: Lane, url: str, timeout: float) -> ReplicaReport:
    report = ReplicaReport(url)
    headers = {"Authorization": f"Bearer {key}"} if (key := lane.upstream_api_key()) else {}
    try:
        resp = httpx.get(url + "/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        report.findings.append(Finding("replicas", f"{url} did not answer GET /v1/models: {_why(exc)}", "unreachable"))
        return report
    if resp.status_code >= 400:
        report.findings.append(Finding("replicas", f"{url}/v1/models answered HTTP {resp.status_code}"
                                       + (" (is api_key_env set?)" if resp.status_code in (401, 403) else ""),
                                       "unreachable"))
        return report
    try:
        cards = [c for c in resp.json().get("data") or [] if isinstance(c, dict)]
    except (ValueError, AttributeError):
        report.findings.append(Finding("replicas", f"{url}/v1/models is not an OpenAI model list", "unreachable"))
        return report
    report.served = [str(c.get("id")) for c in cards]
    report.card = next((c for c in cards if c.get("id") == lane.upstream_model), None)
    report.findings.extend(compare(lane, report))
    return report


def compare(lane: Lane, report: ReplicaReport) -> list[Finding]:
    url, card = report.url, report.card
    if card is None:
        return [Finding("upstream_model", f"{url} does not serve {lane.upstream_model!r} "
                                          f"(it serves: {', '.join(report.served) or 'nothing'})")]
    out: list[Finding] = []
    owner = str(card.get("owned_by") or "")
    if lane.engine in ("vllm", "sglang") and owner in ("vllm", "sglang") and owner != lane.engine:
        out.append(Finding("engine", f"{url} is {owner}, the lane says engine: {lane.engine} "
                                     "(the render normalisation and usage fields differ)"))
    window = card.get("max_model_len")
    limits = lane.limits
    if isinstance(window, int) and window > 0:
        if limits.max_context_tokens is not None and limits.max_context_tokens > window:
            out.append(Finding("limits.max_context_tokens",
                               f"the lane admits {limits.max_context_tokens} tokens, {url} serves max_model_len "
                               f"{window}: requests in between pass the gateway and fail at the engine"))
        elif limits.max_context_tokens is None:
            out.append(Finding("limits", f"{url} serves max_model_len {window}; set limits.max_context_tokens "
                                         "to answer longer requests before the engine does", "note"))
        if limits.max_output_tokens is not None and limits.max_output_tokens >= window:
            out.append(Finding("limits.max_output_tokens", f"max_output_tokens {limits.max_output_tokens} does "
                                                           f"not fit {url}'s max_model_len {window}"))
    if lane.revision and report.revision and lane.revision != report.revision:
        out.append(Finding("revision", f"the lane says revision {lane.revision!r}, {url} reports "
                                       f"{report.revision!r}"))
    return out


def probe_lane(lane: Lane, timeout: float) -> tuple[list[ReplicaReport], str | None]:
    """Every replica's report, and the revision they report (None when unknown); replicas that
    disagree with each other on the revision are a finding of the first one."""
    reports = [probe_replica(lane, url, timeout) for url in lane.replicas]
    revisions = {r.revision for r in reports if r.revision}
    if len(revisions) > 1:
        reports[0].findings.append(Finding("replicas", "the replicas report different models: "
                                                       + ", ".join(sorted(revisions))))
    return reports, (next(iter(revisions)) if len(revisions) == 1 else None)


def _why(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
