"""Conversations: identity, effort pinning, drift detection, cache verdicts and alerts."""
