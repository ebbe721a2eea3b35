"""Upstream emulator: an OpenAI-compatible server that behaves like SGLang or vLLM, with a real prefix cache.

    from gateway.emulator import EmulatorConfig, create_app, run, main
    app = create_app(EmulatorConfig(flavour="sglang", decode_tps=200))

Modules: config (knobs), tokens (prompt -> token ids), cache (block-hash LRU pool), generation (what
the model says), shapes (each engine's JSON), stats, server (aiohttp handlers), job (one generation,
paced), responses (the JSON answers both give), cli.
"""

from .cli import main, run
from .config import EmulatorConfig
from .server import Emulator, create_app

__all__ = ["Emulator", "EmulatorConfig", "create_app", "main", "run"]
