"""Watching what happened: the aftermath of an exchange, metrics, the access log, the collector's settings."""
