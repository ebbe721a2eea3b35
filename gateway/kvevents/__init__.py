"""The engines' own KV-cache events (vLLM `--kv-events-config`, SGLang's equivalent): which blocks each
replica's pool holds, who pushed a conversation's prefix out, and pool pressure before it bites.

  events.py      decode the msgpack EventBatch (vLLM map and array forms, SGLang)
  chain.py       block keys from token ids (the same from an event and from the gateway's render)
  index.py       one replica's pool as its events describe it (bounded)
  subscriber.py  the ZMQ stream: sequence checks, replay of gaps, restarts, connection state
  verdict.py     explain(index, Question) -> Verdict: why a turn's cached prefix was short
  pressure.py    working set, forecast of evictions, the alert
  pool.py        the pool size from the engine's /metrics
  placement.py   what routers ask: which pool holds a new conversation's prefix (prefix_source: kv_events)
  service.py     all of it per replica, in step with routes.yaml; the analyzer's hook; views, metrics
  feature.py     GET /admin/api/kv and the metrics collector (wired in compose.py)
  report.py      the KV section of `gateway stats --url`
"""
