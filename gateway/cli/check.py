"""`gateway check [routes.yaml] [--probe]`: would this file serve, lane by lane? A deploy gate.

Exit 0 when every lane would serve; 1 when a lane would be refused (qualification) or, with --probe,
a replica disagrees with its lane; 2 when the file itself is refused (invalid YAML or keys, a missing
template or tokenizer file); 3 when, with --probe, a replica does not answer. Every problem is one
line on stderr: `routes.yaml:<line>: lanes.<lane>.<key>: <why>`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .common import CHECK_EXTRAS, EXIT_OK, EXIT_PROBLEM, EXIT_UNREACHABLE, CliError, load_config
from ..core.yaml_lines import key_line

# The qualification identity's fields, as keys of a lane in routes.yaml.
_IDENTITY_KEYS = {"engine": "engine", "upstream_model": "upstream_model", "revision": "revision",
                  "replicas": "replicas", "template": "render", "limits": "limits", "emulator": "emulator"}


def run_check(routes_file: str, *, probe: bool = False, records_dir: str | None = None,
              redis_url: str | None = None, timeout: float = 5.0) -> int:
    config = load_config(routes_file)
    text = Path(routes_file).read_text(encoding="utf-8")
    if redis_url:
        _check_redis(redis_url)

    def where(lane: str, key: str = "") -> str:
        return _where(routes_file, text, lane, key)

    compile_templates(config, routes_file)
    _check_key_files(config, routes_file, text)
    print(f"{routes_file}: valid, {len(config.lanes)} lanes, {len(config.models)} models")
    for alias, lane in config.models.items():
        print(f"  {alias} -> {lane} ({config.lanes[lane].engine}, {len(config.lanes[lane].replicas)} replicas)")
    from ..render.told import untold

    # Lane values the engine cannot be told per request: warnings (the lane may well equal the engine).
    for name, lane_cfg in config.lanes.items():
        for problem in untold(lane_cfg):
            print(f"  warning: {where(name, 'render')}: {problem}")

    problems: list[str] = []
    status = EXIT_OK
    observed: dict[str, str | None] = {}
    if probe:
        from ..upstream.probe import probe_lane

        print("replicas:")
        for name, lane in config.lanes.items():
            reports, observed[name] = probe_lane(lane, timeout)
            for r in reports:
                card = r.card or {}
                print(f"  {name} {r.url}: " + (f"serves {lane.upstream_model} (max_model_len "
                                               f"{card.get('max_model_len', '?')}, root {card.get('root', '?')})"
                                               if r.card else "no model card for the lane's model"))
                for f in r.findings:
                    if f.severity == "note":
                        print(f"    note: {f.message}")
                        continue
                    problems.append(f"{where(name, f.key)}: {f.message}")
                    status = max(status, EXIT_UNREACHABLE if f.severity == "unreachable" else EXIT_PROBLEM)

    refused: dict[str, Any] = {}
    for extra in CHECK_EXTRAS:
        refused.update(extra(config, routes_file, observed=observed, records_dir=records_dir, redis_url=redis_url)
                       or {})
    for name, why in refused.items():
        fields = why.get("changed_fields") or []
        key = _IDENTITY_KEYS.get(fields[0], "") if fields else ""
        problems.append(f"{where(name, key)}: lane would be refused: {why.get('reason')}")
        status = max(status, EXIT_PROBLEM)
    for line in problems:
        print(line, file=sys.stderr)
    print("check: " + ("ok" if not problems else f"{len(problems)} problem(s), see stderr"))
    return status


def _check_redis(url: str) -> None:
    """Qualification records in Redis: a malformed URL is exit 2, an unreachable Redis exit 3."""
    from urllib.parse import urlsplit

    import redis

    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise CliError(f"--redis {url!r} is not a redis://, rediss:// or unix:// URL")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
        client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        raise CliError(f"Redis at {url} does not answer: {exc}", EXIT_UNREACHABLE) from None


def _check_key_files(config: Any, routes_file: str, text: str) -> None:
    """A key file that cannot be read (or holds something else than digests) stops the gateway at start."""
    from ..server.security import SecurityConfigError, check_keys

    try:
        check_keys(config, routes_file, production=False)
    except SecurityConfigError as exc:
        line = key_line(text, ["gateway", "client_keys", "hashed_file"])
        raise CliError(f"{routes_file}:{line}: gateway.client_keys.hashed_file: {exc}" if line else str(exc)) from None


def _where(routes_file: str, text: str, lane: str, key: str = "") -> str:
    """`routes.yaml:21: lanes.a.render.template` (the line when the key is written in the file)."""
    path = ["lanes", lane, *[p for p in key.split(".") if p]]
    line = key_line(text, path)
    return f"{routes_file}:{line}: {'.'.join(path)}" if line else f"{routes_file}: {'.'.join(path)}"


def compile_templates(config: Any, routes_file: str) -> None:
    """Compile every lane's template now, as the gateway will at start (existence is checked on load):
    `gateway check` and `gateway serve` refuse a template that does not compile, in one line."""
    import jinja2

    text = Path(routes_file).read_text(encoding="utf-8")

    def where(lane: str, key: str = "") -> str:
        return _where(routes_file, text, lane, key)

    from ..render.template import TemplateNotFound, load_template

    for name, lane in config.lanes.items():
        r = lane.render
        if r.template:
            try:
                load_template(r.template)
            except TemplateNotFound as exc:
                raise CliError(f"{where(name, 'render.template')}: {exc}") from None
            except jinja2.TemplateError as exc:
                lineno = getattr(exc, "lineno", None)  # a syntax error's; other template errors have none
                line = f" line {lineno}" if lineno else ""
                raise CliError(f"{where(name, 'render.template')}: the template does not compile "
                               f"({r.template}{line}: {exc.message})") from None
