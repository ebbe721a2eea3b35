"""The gateway's optional parts, installed in this order at start-up.

Each module named here exposes `install(gw: Gateway) -> None`, which may add routes, hot-path
policies, gates, aftermath steps, start-up and shutdown hooks. A module missing from this
checkout is skipped, so parts can land one at a time.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import Gateway

log = logging.getLogger("gateway.features")

FEATURE_MODULES = (
    "gateway.security",  # client and admin keys (first: it guards everything after it)
    "gateway.store.feature",  # state backend: memory or Redis
    "gateway.render.feature",  # per-lane renderers
    "gateway.limits.feature",  # lane limits on the hot path
    "gateway.conversations.feature",  # identity, effort pinning, drift, cache verdicts
    "gateway.routing.feature",  # replica routing lookups (after conversations: homes need them)
    "gateway.metrics",  # Prometheus
    "gateway.kvevents.feature",  # the engines' KV-cache events (after conversations and metrics: it hooks both)
    "gateway.records.feature",  # per-request records
    "gateway.qualify.feature",  # refuse unqualified lanes
    "gateway.admin.feature",  # /admin pages and APIs
)


def install_all(gw: "Gateway") -> list[str]:
    installed = []
    for name in FEATURE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # this part is not in the checkout
            raise
        module.install(gw)
        installed.append(name)
    log.debug("features installed: %s", installed)
    return installed
