"""Exchanges built in the test's own process, for the code that reads a finished one (records,
metrics, alerts) without a server."""

from __future__ import annotations

from gateway.core.exchange import Exchange


def exchange(**kw) -> Exchange:
    """A finished streaming exchange: 100 ms to first token, 11 tokens at 50 tok/s."""
    ex = Exchange(request_id=kw.pop("request_id", "r1"))
    t0 = ex.started
    ex.public_model, ex.lane, ex.replica, ex.stream, ex.status = "m", "lane-a", "http://r1", True, 200
    ex.t_forwarded = t0 + 0.002
    ex.t_first_byte = t0 + 0.05
    ex.token_chunk_times = [t0 + 0.1 + i * 0.02 for i in range(11)]
    ex.t_first_token, ex.t_last_token = ex.token_chunk_times[0], ex.token_chunk_times[-1]
    ex.t_end = t0 + 0.35
    ex.usage = {"prompt_tokens": 1000, "completion_tokens": 11,
                "prompt_tokens_details": {"cached_tokens": 600}}
    ex.generated.content.extend(["secret ", "answer"])
    ex.body = {"model": "m", "messages": [{"role": "user", "content": "a private prompt"}]}
    for k, v in kw.items():
        setattr(ex, k, v)
    return ex
