"""Client and admin keys: who may use /v1/*, and who may read /admin, /metrics and change state.

Configured in routes.yaml by reference only, never the keys themselves::

    gateway:
      client_keys:
        env: GATEWAY_CLIENT_KEYS        # comma-separated keys in this environment variable
        hashed_file: client_keys.sha256 # sha256 hex digests, one per line (`# comments`, an optional label)
      admin_key_env: GATEWAY_ADMIN_KEY  # the admin key, in this environment variable

- A client presents its key as ``Authorization: Bearer <key>`` (what every OpenAI client sends) or
  ``X-Api-Key``/``Api-Key``. The check is one dict lookup of the key's sha256 digest (bucketed by
  its first 8 bytes) and ``hmac.compare_digest`` against the full 32-byte digest: constant time in
  the number of keys and in where two digests differ. It runs before the body is read.
- The admin key (``Authorization: Bearer`` or ``X-Admin-Key``) guards everything that calls
  ``gw.services["admin_guard"]``. The /admin page shell and its static files carry no data and are
  served without it (the page sends the key with every API call it makes); the data under it is not.
- No keys at all: demo mode, loudly said at start. Client keys but no admin key: the admin
  endpoints refuse (403) rather than stand open. ``GATEWAY_PRODUCTION=1``: refuses to start without
  client keys and an admin key (of at least 16 characters).
- Keys are never logged, never echoed in an error, never forwarded upstream: the proxy builds the
  upstream's headers itself, with the lane's own key from ``api_key_env``.
- Client keys are re-read when routes.yaml is reloaded; a reload whose keys cannot be read keeps
  the old ones.

Installing this part also installs the active replica health probes (gateway.health) and the
``GET /openapi.json`` description (gateway.openapi): the three make up the hardening of the gateway.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from .config import ClientKeys, RoutesConfig
from .errors import GatewayError

if TYPE_CHECKING:
    from .app import Gateway

log = logging.getLogger("gateway.security")

MIN_PRODUCTION_ADMIN_KEY = 16
_BUCKET = 8  # bytes of the digest that pick the bucket; the whole digest is compared in constant time
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway"'}
_PUBLIC_ADMIN_PATHS = ("/admin", "/admin/")
_PUBLIC_ADMIN_PREFIX = "/admin/static/"

Endpoint = Callable[[Request], Awaitable[Response]]


class SecurityConfigError(RuntimeError):
    """The gateway must not start with these keys (production without keys, unreadable key file)."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """A set of key digests: membership in O(1), compared with hmac.compare_digest."""

    def __init__(self, digests: list[bytes] | None = None) -> None:
        self._buckets: dict[bytes, tuple[bytes, ...]] = {}
        for d in digests or ():
            if len(d) != 32:
                raise ValueError("a key digest is 32 bytes (sha256)")
            self._buckets[d[:_BUCKET]] = self._buckets.get(d[:_BUCKET], ()) + (d,)
        self.size = sum(len(v) for v in self._buckets.values())

    def __len__(self) -> int:
        return self.size

    def matches(self, key: str) -> bool:
        d = digest(key)
        found = False
        for candidate in self._buckets.get(d[:_BUCKET], ()):
            found |= hmac.compare_digest(candidate, d)
        return found


@dataclass(frozen=True)
class KeySource:
    """Where the keys of one config come from (to rebuild the ring only when that changes)."""

    client_keys: ClientKeys | None
    admin_key_env: str | None
    base_dir: Path


def _parse_hashed_file(path: Path) -> list[bytes]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecurityConfigError(f"client_keys.hashed_file {str(path)!r}: cannot read: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        hexd = line.split()[0].lower()
        if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
            # Say where, never what: the line might be a plain key pasted by mistake.
            raise SecurityConfigError(f"client_keys.hashed_file {str(path)!r} line {n}: "
                                      "not a sha256 hex digest (64 hex characters)")
        out.append(bytes.fromhex(hexd))
    return out


def load_client_keys(source: KeySource) -> KeyRing | None:
    """The configured client keys; None when routes.yaml configures none (demo mode)."""
    ck = source.client_keys
    if ck is None or (ck.env is None and ck.hashed_file is None):
        return None
    digests: list[bytes] = []
    if ck.env:
        raw = os.environ.get(ck.env, "")
        digests += [digest(k.strip()) for k in raw.split(",") if k.strip()]
    if ck.hashed_file:
        path = Path(ck.hashed_file)
        if not path.is_absolute():
            path = source.base_dir / path
        digests += _parse_hashed_file(path)
    return KeyRing(digests)


def load_admin_key(source: KeySource) -> bytes | None:
    if not source.admin_key_env:
        return None
    value = os.environ.get(source.admin_key_env, "").strip()
    return digest(value) if value else None


def production_problems(client_keys: KeyRing | None, admin_digest: bytes | None, admin_key_env: str | None) -> list[str]:
    """Why GATEWAY_PRODUCTION=1 would refuse to start with these keys (empty: it starts)."""
    problems = []
    if not client_keys:
        problems.append("no client keys (set gateway.client_keys.env or .hashed_file in routes.yaml, "
                        "and provide the keys)")
    if admin_digest is None:
        problems.append("no admin key (set gateway.admin_key_env in routes.yaml and that variable)")
    elif admin_key_env and len(os.environ.get(admin_key_env, "").strip()) < MIN_PRODUCTION_ADMIN_KEY:
        problems.append(f"the admin key is shorter than {MIN_PRODUCTION_ADMIN_KEY} characters")
    return problems


def check_keys(config: RoutesConfig, routes_path: str | Path, production: bool) -> None:
    """What start-up would refuse, before anything starts: an unreadable key file, production without keys.
    Raises SecurityConfigError."""
    source = KeySource(config.gateway.client_keys, config.gateway.admin_key_env, Path(routes_path).resolve().parent)
    clients = load_client_keys(source)
    problems = production_problems(clients, load_admin_key(source), source.admin_key_env)
    if production and problems:
        raise SecurityConfigError("GATEWAY_PRODUCTION=1 refuses to start: " + "; ".join(problems))


def presented_key(request: Request) -> str | None:
    """The key a client sent: ``Authorization: Bearer``, else ``X-Api-Key`` / ``Api-Key``."""
    headers = request.headers
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return headers.get("x-api-key") or headers.get("api-key") or None


class Security:
    """The live keys of one gateway process and the checks that use them."""

    def __init__(self, gw: "Gateway") -> None:
        self.gw = gw
        self.rejected = {"client_missing": 0, "client_invalid": 0, "admin_missing": 0, "admin_invalid": 0}
        config = gw.runtime.snapshot.config
        self._config: RoutesConfig = config
        self._source = self._source_of(config)
        self.client_keys = load_client_keys(self._source)
        self.admin_digest = load_admin_key(self._source)

    # -- loading -------------------------------------------------------------------------------

    def _source_of(self, config: RoutesConfig) -> KeySource:
        routes = Path(self.gw.settings.routes_path)
        return KeySource(config.gateway.client_keys, config.gateway.admin_key_env, routes.resolve().parent)

    def _current(self) -> None:
        """Follow reloads of routes.yaml: one identity check per request, a rebuild when keys moved."""
        config = self.gw.runtime.snapshot.config
        if config is self._config:
            return
        self._config = config
        source = self._source_of(config)
        if source == self._source:
            return
        try:
            clients = load_client_keys(source)
        except SecurityConfigError as exc:
            log.error("client keys of the reloaded routes.yaml refused, the old keys stay: %s", exc)
            return
        admin = load_admin_key(source)
        if self.gw.settings.production and (not clients or admin is None):
            log.error("the reloaded routes.yaml has no client or admin key; production keeps the old keys")
            return
        self._source, self.client_keys, self.admin_digest = source, clients, admin
        log.warning("keys reloaded: %s", self.describe())

    def describe(self) -> str:
        clients = "none (open)" if self.client_keys is None else f"{len(self.client_keys)} client key(s)"
        admin = "admin key set" if self.admin_digest is not None else "no admin key"
        return f"{clients}, {admin}"

    @property
    def demo(self) -> bool:
        return self.client_keys is None and self.admin_digest is None

    # -- checks --------------------------------------------------------------------------------

    def client_verdict(self, request: Request) -> str | None:
        """None when the request may use /v1/*, else "missing" or "invalid"."""
        self._current()
        ring = self.client_keys
        if ring is None:
            return None
        key = presented_key(request)
        if key is None:
            return "missing"
        return None if ring.matches(key) else "invalid"

    def check_client(self, request: Request) -> None:
        verdict = self.client_verdict(request)
        if verdict is None:
            return
        self.rejected["client_" + verdict] += 1
        if verdict == "missing":
            raise GatewayError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                               code="missing_api_key", type="invalid_request_error", headers=_CHALLENGE)
        raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key",
                           type="invalid_request_error", headers=_CHALLENGE)

    async def admin_guard(self, request: Request) -> None:
        self._current()
        path = request.url.path
        if request.method in ("GET", "HEAD") and (path in _PUBLIC_ADMIN_PATHS or path.startswith(_PUBLIC_ADMIN_PREFIX)):
            return  # the page shell and its assets: no data; every API call of the page sends the key
        want = self.admin_digest
        if want is None:
            if self.client_keys is None:
                return  # demo mode: said loudly at start
            raise GatewayError(403, "admin endpoints are disabled: no admin key is configured "
                                    "(gateway.admin_key_env)", code="admin_key_not_configured")
        key = request.headers.get("x-admin-key") or presented_key(request)
        if not key:
            self.rejected["admin_missing"] += 1
            raise GatewayError(401, "this endpoint needs the admin key ('Authorization: Bearer <admin key>')",
                               code="missing_admin_key", headers=_CHALLENGE)
        if not hmac.compare_digest(digest(key), want):
            self.rejected["admin_invalid"] += 1
            if self.client_keys is not None and self.client_keys.matches(key):
                raise GatewayError(403, "a client key cannot use admin endpoints", code="admin_key_required")
            raise GatewayError(401, "incorrect admin key", code="invalid_admin_key", headers=_CHALLENGE)

    def guarded(self, handler: Endpoint) -> Endpoint:
        check = self.check_client

        async def endpoint(request: Request) -> Response:
            check(request)
            return await handler(request)

        endpoint.__name__ = getattr(handler, "__name__", "endpoint")
        endpoint.__doc__ = handler.__doc__
        return endpoint

    # -- start-up ----------------------------------------------------------------------------------

    def startup_report(self) -> None:
        """Say at start what protects this gateway; refuse to start in production without keys."""
        settings = self.gw.settings
        problems = production_problems(self.client_keys, self.admin_digest, self._source.admin_key_env)
        if settings.production and problems:
            raise SecurityConfigError("GATEWAY_PRODUCTION=1 refuses to start: " + "; ".join(problems))
        for name, lane in self.gw.runtime.snapshot.config.lanes.items():
            if lane.api_key_env and not os.environ.get(lane.api_key_env):
                log.warning("lane %s: upstream key variable %s is not set; requests go without one",
                            name, lane.api_key_env)
        if self.demo:
            log.warning(_banner(
                "DEMO MODE: NO API KEYS. Anyone who can reach this port may use every lane,",
                "read /admin and /metrics, and change state. Configure gateway.client_keys and",
                "gateway.admin_key_env in routes.yaml; GATEWAY_PRODUCTION=1 refuses to start without them.",
            ))
        elif self.client_keys is None:
            log.warning(_banner("NO CLIENT KEYS: /v1/* is open to anyone who can reach this port."))
        elif not self.client_keys:
            log.warning(_banner("client_keys is configured but no key was found: every /v1/* request is refused."))
        if not self.demo and self.admin_digest is None:
            log.warning(_banner("NO ADMIN KEY: /admin data, /metrics and state-changing endpoints answer 403."))
        log.info("keys: %s", self.describe())


def _banner(*lines: str) -> str:
    width = max(len(line) for line in lines) + 4
    bar = "!" * width
    return "\n".join(["", bar, *(f"! {line.ljust(width - 4)} !" for line in lines), bar])


def install(gw: "Gateway") -> None:
    security = Security(gw)
    security.startup_report()  # raises SecurityConfigError in production without keys
    gw.services["security"] = security
    gw.services["admin_guard"] = security.admin_guard
    # Every public /v1 endpoint checks the client key first, before the body is read. The app
    # builds its routes from these attributes after the parts are installed.
    gw.pipeline.chat = security.guarded(gw.pipeline.chat)  # type: ignore[method-assign]
    gw.pipeline.completions = security.guarded(gw.pipeline.completions)  # type: ignore[method-assign]
    gw.models = security.guarded(gw.models)  # type: ignore[method-assign]
    gw.model = security.guarded(gw.model)  # type: ignore[method-assign]

    from . import health, openapi

    health.install(gw)
    openapi.install(gw)


__all__ = ["KeyRing", "Security", "SecurityConfigError", "digest", "install", "presented_key"]
