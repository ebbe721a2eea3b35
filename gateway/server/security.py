"""Client and admin keys: who may use /v1/*, who may read /admin and /metrics, and whose tenant a request is.

Configured in routes.yaml by reference only, never the keys themselves::

    gateway:
      client_keys:
        env: GATEWAY_CLIENT_KEYS        # comma-separated keys in this environment variable
        hashed_file: client_keys.sha256 # sha256 hex digests, one per line, each with an optional tenant label
      admin_key_env: GATEWAY_ADMIN_KEY  # the admin key, in this environment variable

- A client presents its key as ``Authorization: Bearer <key>`` (what every OpenAI client sends) or
  ``X-Api-Key``/``Api-Key``. The check is one dict lookup of the key's sha256 digest (bucketed by
  its first 8 bytes) and ``hmac.compare_digest`` against the full 32-byte digest: constant time in
  the number of keys and in where two digests differ. It runs before the body is read.
- Every client key belongs to a tenant: the label after its digest in the hashed file, else
  ``key-<first 8 hex digits of its sha256>`` (an id, never the key). Conversations, pins, alerts and
  records are scoped by tenant; without client keys every request is tenant ``default``.
- Which key a route needs is declared once, in the route table (access.py): admin unless declared
  otherwise. `Security.protect` wraps each handler with its check when the app is built.
- No keys at all: demo mode, loudly said at start. Client keys but no admin key: the admin
  endpoints refuse (403) rather than stand open. ``GATEWAY_PRODUCTION=1``: refuses to start without
  client keys and an admin key (of at least 16 characters).
- Keys are never logged, never echoed in an error, never forwarded upstream: the proxy builds the
  upstream's headers itself, with the lane's own key from ``api_key_env``.
- Client keys are re-read when routes.yaml is reloaded; a reload whose keys cannot be read keeps
  the old ones.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from starlette.requests import Request

from .access import Access, Endpoint, Handler, Reply
from ..core.config import ClientKeys, RoutesConfig
from ..core.errors import GatewayError

if TYPE_CHECKING:
    from ..core.runtime import Runtime
    from ..core.settings import Settings

log = logging.getLogger("gateway.security")

MIN_PRODUCTION_ADMIN_KEY = 16
_BUCKET = 8  # bytes of the digest that pick the bucket; the whole digest is compared in constant time
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway"'}
DEFAULT_TENANT = "default"
_TENANT_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Caller:
    """Who sent a /v1 request, as far as the gateway knows it: the tenant of the key (never the key)."""

    tenant: str = DEFAULT_TENANT


ClientHandler = Callable[[Request, Caller], Awaitable[Reply]]


class SecurityConfigError(RuntimeError):
    """The gateway must not start with these keys (production without keys, unreadable key file)."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def key_tenant(d: bytes) -> str:
    """The tenant id of an unlabelled key: derived from its digest, so it says nothing of the key."""
    return "key-" + d.hex()[:8]


class KeyRing:
    """A set of key digests, each with its tenant: look-up in O(1), compared with hmac.compare_digest."""

    def __init__(self, entries: list[tuple[bytes, str]] | list[bytes] | None = None) -> None:
        self._buckets: dict[bytes, tuple[tuple[bytes, str], ...]] = {}
        for entry in entries or ():
            d, tenant = entry if isinstance(entry, tuple) else (entry, key_tenant(entry))
            if len(d) != 32:
                raise ValueError("a key digest is 32 bytes (sha256)")
            self._buckets[d[:_BUCKET]] = self._buckets.get(d[:_BUCKET], ()) + ((d, tenant),)
        self.size = sum(len(v) for v in self._buckets.values())

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyRing) and self._buckets == other._buckets

    __hash__ = None  # type: ignore[assignment]

    def tenant_of(self, key: str) -> str | None:
        d = digest(key)
        found: str | None = None
        for candidate, tenant in self._buckets.get(d[:_BUCKET], ()):
            if hmac.compare_digest(candidate, d):
                found = tenant
        return found

    def matches(self, key: str) -> bool:
        return self.tenant_of(key) is not None


@dataclass(frozen=True)
class KeySource:
    """Where the keys of one config come from (to rebuild the ring only when that changes)."""

    client_keys: ClientKeys | None
    admin_key_env: str | None
    base_dir: Path


def _parse_hashed_file(path: Path) -> list[tuple[bytes, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecurityConfigError(
            f"client_keys.hashed_file {str(path)!r}: cannot read: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        hexd = parts[0].lower()
        if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
            # Say where, never what: the line might be a plain key pasted by mistake.
            raise SecurityConfigError(f"client_keys.hashed_file {str(path)!r} line {n}: "
                                      "not a sha256 hex digest (64 hex characters)")
        d = bytes.fromhex(hexd)
        label = parts[1] if len(parts) > 1 else None
        if label is not None and not _TENANT_LABEL.fullmatch(label):
            raise SecurityConfigError(f"client_keys.hashed_file {str(path)!r} line {n}: the tenant label must be "
                                      "1-64 characters of letters, digits, '.', '_' or '-'")
        out.append((d, label or key_tenant(d)))
    return out


def load_client_keys(source: KeySource) -> KeyRing | None:
    """The configured client keys; None when routes.yaml configures none (demo mode)."""
    ck = source.client_keys
    if ck is None or (ck.env is None and ck.hashed_file is None):
        return None
    entries: list[tuple[bytes, str]] = []
    if ck.env:
        # Keys are read from the variables routes.yaml names, when keys are (re)loaded: a reload may name
        # another, and secrets are never held in Settings (core/settings.py).
        raw = os.environ.get(ck.env, "")
        for k in raw.split(","):
            if k.strip():
                d = digest(k.strip())
                entries.append((d, key_tenant(d)))
    path = hashed_file_path(source)
    if path is not None:
        entries += _parse_hashed_file(path)
    return KeyRing(entries)


def hashed_file_path(source: KeySource) -> Path | None:
    """The key file, relative to routes.yaml's folder unless absolute."""
    ck = source.client_keys
    if ck is None or not ck.hashed_file:
        return None
    path = Path(ck.hashed_file)
    return path if path.is_absolute() else source.base_dir / path


def load_admin_key(source: KeySource) -> bytes | None:
    if not source.admin_key_env:
        return None
    value = os.environ.get(source.admin_key_env, "").strip()  # a secret: see load_client_keys
    return digest(value) if value else None


def production_problems(client_keys: KeyRing | None, admin_digest: bytes | None,
                        admin_key_env: str | None) -> list[str]:
    """Why GATEWAY_PRODUCTION=1 would refuse to start with these keys (empty: it starts)."""
    problems = []
    if not client_keys:
        problems.append("no client keys (set gateway.client_keys.env or .hashed_file in routes.yaml, "
                        "and provide the keys)")
    if admin_digest is None:
        problems.append("no admin key (set gateway.admin_key_env in routes.yaml and that variable)")
    elif admin_key_env and len(os.environ.get(admin_key_env, "").strip()) < MIN_PRODUCTION_ADMIN_KEY:  # a secret
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

    def __init__(self, runtime: "Runtime", settings: "Settings",
                 qualify_tokens: Callable[[], list[str]] | None = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.qualify_tokens = qualify_tokens or (lambda: [])
        self.rejected = {"client_missing": 0, "client_invalid": 0, "admin_missing": 0, "admin_invalid": 0}
        self._snapshot = runtime.snapshot
        self._source = self._source_of(runtime.snapshot.config)
        self.client_keys = load_client_keys(self._source)
        self.admin_digest = load_admin_key(self._source)
        self.key_error: str | None = None  # why the last reload's keys were refused (the old ones serve)

    # -- loading -------------------------------------------------------------------------------

    def _source_of(self, config: RoutesConfig) -> KeySource:
        routes = Path(self.settings.routes_path)
        return KeySource(config.gateway.client_keys, config.gateway.admin_key_env, routes.resolve().parent)

    def _current(self) -> None:
        """Follow reloads: one identity check per request, the keys read again on every reload.

        A reload (SIGHUP, a change of routes.yaml or of the key file) re-reads the key file and the
        key variables even when routes.yaml names the same ones: a revoked key stops working then.
        Keys that cannot be read keep the last good ones serving, and say why (key_error, /readyz)."""
        snapshot = self.runtime.snapshot
        if snapshot is self._snapshot:
            return
        self._snapshot = snapshot
        source = self._source_of(snapshot.config)
        try:
            clients = load_client_keys(source)
        except SecurityConfigError as exc:
            self.key_error = str(exc)
            log.error("client keys refused on reload, the last good keys stay: %s", exc)
            return
        admin = load_admin_key(source)
        if self.settings.production and (not clients or admin is None):
            self.key_error = "the reloaded configuration has no client or admin key"
            log.error("%s; production keeps the old keys", self.key_error)
            return
        changed = (source, clients, admin) != (self._source, self.client_keys, self.admin_digest)
        self._source, self.client_keys, self.admin_digest, self.key_error = source, clients, admin, None
        if changed:
            log.warning("keys reloaded: %s", self.describe())

    def key_file(self) -> Path | None:
        """The hashed key file the current configuration names (watched like routes.yaml)."""
        return hashed_file_path(self._source_of(self.runtime.snapshot.config))

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
        try:
            self.caller(request)
        except GatewayError as exc:
            return "missing" if exc.code == "missing_api_key" else "invalid"
        return None

    def caller(self, request: Request) -> Caller:
        """The client's tenant, or a 401 in OpenAI's shape (before the body is read)."""
        self._current()
        ring = self.client_keys
        if ring is None:
            return _DEFAULT_CALLER
        key = presented_key(request)
        if key is None:
            self.rejected["client_missing"] += 1
            raise GatewayError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                               code="missing_api_key", type="invalid_request_error", headers=_CHALLENGE)
        tenant = ring.tenant_of(key)
        if tenant is None:
            self.rejected["client_invalid"] += 1
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key",
                               type="invalid_request_error", headers=_CHALLENGE)
        return _callers.get(tenant) or _callers.setdefault(tenant, Caller(tenant))

    def is_admin(self, request: Request) -> bool:
        """True when the request carries the admin key (never in demo mode: there is none)."""
        self._current()
        want = self.admin_digest
        key = request.headers.get("x-admin-key") or presented_key(request)
        if want is None or not key:
            return False
        return hmac.compare_digest(digest(key), want)

    def check_admin(self, request: Request) -> None:
        self._current()
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

    def check_qualify(self, request: Request) -> None:
        """The qualify token (X-Gateway-Qualify), or else the admin key."""
        given = request.headers.get(QUALIFY_HEADER)
        if given and any(hmac.compare_digest(given.encode(), t.encode()) for t in self.qualify_tokens()):
            return
        if self.demo:  # no admin key to fall back on: the token (data dir: qualify.token) is the only way
            raise GatewayError(403, f"this route needs the qualify token in the {QUALIFY_HEADER} header",
                               code="qualify_token_required")
        self.check_admin(request)

    # -- the one place protection is applied ---------------------------------------------------

    def protect(self, endpoint: Endpoint) -> Handler:
        """The endpoint's handler behind the check its declared access needs."""
        handler = endpoint.handler
        access = endpoint.access
        if access is Access.PUBLIC:
            return handler
        if access is Access.CLIENT:
            client_handler: ClientHandler = handler  # type: ignore[assignment]
            caller = self.caller
            shape = endpoint.errors

            async def client_endpoint(request: Request) -> Reply:
                try:
                    who = caller(request)
                except GatewayError as exc:
                    if shape is None:
                        raise
                    raise shape(exc) from None
                return await client_handler(request, who)

            return _named(client_endpoint, handler)
        check = self.check_qualify if access is Access.QUALIFY else self.check_admin

        async def guarded(request: Request) -> Reply:
            check(request)
            return await handler(request)

        return _named(guarded, handler)

    # -- start-up ----------------------------------------------------------------------------------

    def startup_report(self) -> None:
        """Say at start what protects this gateway; refuse to start in production without keys."""
        settings = self.settings
        problems = production_problems(self.client_keys, self.admin_digest, self._source.admin_key_env)
        if settings.production and problems:
            raise SecurityConfigError("GATEWAY_PRODUCTION=1 refuses to start: " + "; ".join(problems))
        for name, lane in self.runtime.snapshot.config.lanes.items():
            if lane.api_key_env and not os.environ.get(lane.api_key_env):  # a secret routes.yaml names
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


QUALIFY_HEADER = "X-Gateway-Qualify"
_DEFAULT_CALLER = Caller()
_callers: dict[str, Caller] = {}  # one Caller per tenant (bounded by the configured keys)


def _named(fn: Handler, like: object) -> Handler:
    fn.__name__ = getattr(like, "__name__", "endpoint")
    fn.__doc__ = getattr(like, "__doc__", None)
    return fn


def _banner(*lines: str) -> str:
    width = max(len(line) for line in lines) + 4
    bar = "!" * width
    return "\n".join(["", bar, *(f"! {line.ljust(width - 4)} !" for line in lines), bar])


__all__ = ["Caller", "KeyRing", "Security", "SecurityConfigError", "digest", "presented_key"]
