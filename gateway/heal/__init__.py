"""Drift healing: client edits that change a prompt's bytes but not its meaning, repaired
before the engine sees the request, so the turn hits the prefix cache. One module per kind (base.py
says what a kind is); policy.py runs them on the hot path, book.py keeps what the gateway relayed."""
