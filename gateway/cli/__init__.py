"""The `gateway` command: serve, demo, check, render, drift, stats and the admin client."""

from .main import main

__all__ = ["main"]
