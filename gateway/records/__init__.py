"""Per-request records: one row per finished exchange, in SQLite (default) and a Redis stream."""
