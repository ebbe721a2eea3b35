"""`gateway qualify LANE`: run the three gates against a lane and write its qualification record.

    gateway qualify dsv41-vllm                       # in-process, through the gateway's proxy code
    gateway qualify dsv41-vllm --baseline dsv41-old  # A/B/A against another lane, live
    gateway qualify dsv41-vllm --baseline rec.json   # ... or against a stored record's numbers
    gateway qualify dsv41-vllm --gateway http://127.0.0.1:8080   # through a running gateway
    gateway qualify --status                         # every lane's state, exit 1 if one is refused

Exit status: 0 passed, 1 failed, 2 usage or configuration error, 3 no replica (or --gateway) answers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from ..cli.common import CHECK_EXTRAS, SUBCOMMANDS
from ..core.settings import Settings


def register(sub: argparse._SubParsersAction, settings: Settings) -> None:
    p = sub.add_parser("qualify", help="qualify a lane: determinism, sink probe, A/B/A performance",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lane", nargs="?", help="lane name (as under lanes: in routes.yaml)")
    p.add_argument("--baseline", help="a lane to measure live between the candidate runs, or a record "
                                      "(JSON file or record id) whose numbers to compare with")
    p.add_argument("--routes", default=str(settings.routes_path))
    p.add_argument("--gateway", metavar="URL", help="run through this running gateway instead of in-process")
    p.add_argument("--token", default=None, help="qualify token for --gateway (default: $GATEWAY_QUALIFY_TOKEN, "
                                                 "the admin key, or <data dir>/qualify.token)")
    p.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY"),  # a secret: not in Settings
                   help="client key for --gateway")
    p.add_argument("--data-dir", default=str(settings.data_dir))
    p.add_argument("--records", metavar="DIR", help="records directory (default: qualifications/ beside routes.yaml"
                                                    " or $GATEWAY_QUALIFICATIONS)",
                   default=str(settings.qualifications) if settings.qualifications else None)
    p.add_argument("--redis", default=settings.redis_url, help="store records in Redis")
    p.add_argument("--by", help="who qualifies (default: user@host)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--no-save", action="store_true", help="do not store the record")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--status", action="store_true", help="show every lane's qualification state and exit")
    p.add_argument("--demo", action="store_true", help="start the built-in emulator for lanes with `emulator:` "
                                                      "(as `gateway demo` does) and qualify them (all, or LANE)")
    g = p.add_argument_group("gates")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--determinism-tokens", type=int, default=64, help="max_tokens of each suite prompt")
    g.add_argument("--probe-tokens", type=int, default=128, help="max_tokens of each sink probe")
    g.add_argument("--rebaseline", action="store_true", help="accept changed determinism outputs as the new baseline")
    g.add_argument("--no-perf", action="store_true", help="skip A/B/A")
    g.add_argument("--shapes", default=None, help="e.g. decode@2k,decode@32k,throughput@1,throughput@2,throughput@4")
    g.add_argument("--full", action="store_true", help="the full set: more shapes, samples and rounds")
    g.add_argument("--samples", type=int, default=None, help="requests per decode shape per phase (default 5)")
    g.add_argument("--rounds", type=int, default=None, help="rounds per throughput shape per phase (default 4)")
    g.add_argument("--decode-tokens", type=int, default=128)
    g.add_argument("--throughput-tokens", type=int, default=64)
    g.add_argument("--min-effect", type=float, default=0.03, help="relative difference below which a metric is "
                                                                  "'same' (default 0.03)")
    g.add_argument("--allow-worse", action="store_true", help="a 'worse' metric warns instead of failing")
    p.set_defaults(func=cmd_qualify)


def cmd_qualify(args: argparse.Namespace) -> int:
    if args.status:
        return cmd_status(args)
    if args.demo:
        return cmd_demo_lanes(args)
    if not args.lane:
        print("gateway qualify: error: name the lane to qualify (or use --status)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_qualify(args))
    except UsageError as exc:
        print(f"gateway qualify: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


class UsageError(Exception):
    """Printed as one line; exit 2 (usage or input) unless `code` says 3 (unreachable)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _perf_options(args: argparse.Namespace):
    from .perf import PerfOptions
    from .suite import DEFAULT_SHAPES, FULL_SHAPES, parse_shapes

    if args.no_perf:
        return None
    try:
        shapes = parse_shapes(args.shapes or (FULL_SHAPES if args.full else DEFAULT_SHAPES))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return PerfOptions(shapes=shapes, samples=args.samples or (10 if args.full else 5),
                       rounds=args.rounds or (8 if args.full else 4), decode_tokens=args.decode_tokens,
                       throughput_tokens=args.throughput_tokens, min_effect=args.min_effect)


def _load_config(args: argparse.Namespace, required: bool):
    from ..core.config import ConfigError, load_routes

    try:
        return load_routes(args.routes)
    except ConfigError as exc:
        if required:
            raise UsageError(str(exc)) from None
        return None


def resolve_token(args: argparse.Namespace, config: Any) -> str | None:
    """--token, else the secrets' own variables (read here, never held in Settings), else the token file."""
    if args.token:
        return args.token
    if os.environ.get("GATEWAY_QUALIFY_TOKEN"):
        return os.environ["GATEWAY_QUALIFY_TOKEN"]
    admin_env = config.gateway.admin_key_env if config is not None else None
    if admin_env and os.environ.get(admin_env):
        return os.environ[admin_env]
    try:
        return (Path(args.data_dir) / "qualify.token").read_text().strip() or None
    except OSError:
        return None


class LocalRecords:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.where = store.describe()

    async def latest_passing(self, lane: str) -> dict[str, Any] | None:
        from .records import RecordIndex

        s = RecordIndex(self.store.summaries()).latest_passing_for_lane(lane)
        return self.store.load(s.id) if s else None

    async def load(self, ref: str) -> dict[str, Any] | None:
        return self.store.load(ref)

    async def save(self, record: dict[str, Any]) -> str:
        return self.store.save(record)


class RemoteRecords:
    """Records kept by the running gateway (its directory or Redis)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.where = client.base + " (gateway's store)"

    async def latest_passing(self, lane: str) -> dict[str, Any] | None:
        from urllib.parse import quote

        return await self.client.get_json(f"/qualify/records?lane={quote(lane)}&passed=1&latest=1")

    async def load(self, ref: str) -> dict[str, Any] | None:
        from urllib.parse import quote

        try:
            return await self.client.get_json(f"/qualify/records?id={quote(ref)}")
        except RuntimeError:
            return None

    async def save(self, record: dict[str, Any]) -> str:
        return (await self.client.post_json("/qualify/records", record))["id"]


async def _qualify(args: argparse.Namespace) -> int:
    from .client import GatewayLane, InProcessLane
    from .identity import LaneIdentity, lane_identity
    from .progress import Progress
    from .records import open_store
    from .report import render_record
    from .runner import Baseline, QualifyOptions, qualify, whoami
    from .suite import DEFAULT_SEED

    config = _load_config(args, required=not args.gateway)
    perf = _perf_options(args)
    opened: list[Any] = []
    cand: GatewayLane | InProcessLane  # the lane qualified: a running gateway's, or reached from here
    try:
        if args.gateway:
            token = resolve_token(args, config)
            cand = GatewayLane(args.gateway, args.lane, token, args.api_key)
            opened.append(cand)
            try:
                state = await cand.get_json("/qualify/state")
            except Exception as exc:  # noqa: BLE001
                raise UsageError(f"cannot reach the gateway at {args.gateway}: {exc}", 3) from None
            lanes = state.get("lanes") or {}
            if args.lane not in lanes:
                raise UsageError(f"the gateway has no lane {args.lane!r} (it has: {', '.join(lanes)})")
            info = lanes[args.lane]
            identity = LaneIdentity(dict(info["identity_fields"]))
            engine = info.get("engine", "vllm")
            max_context = (identity.fields.get("limits") or {}).get("max_context_tokens")
            records: Any = RemoteRecords(cand)

            def baseline_client(name: str) -> tuple[Any, str] | None:
                if name in lanes:
                    c = GatewayLane(args.gateway, name, token, args.api_key)
                    opened.append(c)
                    return c, lanes[name].get("engine", "vllm")
                return None
        else:
            lane = config.lanes.get(args.lane)
            if lane is None:
                raise UsageError(f"no lane {args.lane!r} in {args.routes} (lanes: {', '.join(config.lanes)})")
            _require_a_replica(args.lane, lane)
            cand = InProcessLane(args.lane, lane)
            opened.append(cand)
            identity = lane_identity(lane)
            engine = lane.engine
            max_context = lane.limits.max_context_tokens
            records = LocalRecords(open_store(args.routes, args.records, args.redis))

            def baseline_client(name: str) -> tuple[Any, str] | None:
                other = config.lanes.get(name)
                if other is None:
                    return None
                c = InProcessLane(name, other)
                opened.append(c)
                return c, other.engine

        if perf is not None and max_context:
            too_big = [s.name for s in perf.shapes if s.prompt_tokens + perf.decode_tokens > max_context]
            perf.shapes = [s for s in perf.shapes if s.prompt_tokens + perf.decode_tokens <= max_context]
            if too_big:
                print(f"note: skipping {', '.join(too_big)}: beyond the lane's max_context_tokens {max_context}",
                      file=sys.stderr)
            if not perf.shapes:
                perf = None
        baseline = None
        if args.baseline:
            if args.baseline == args.lane:
                raise UsageError("--baseline must name another lane or a record")
            found = baseline_client(args.baseline)
            if found is not None:
                baseline = Baseline("lane", f"lane {args.baseline}", client=found[0], engine=found[1])
            else:
                rec = _read_record_file(args.baseline) or await records.load(args.baseline)
                if rec is None:
                    raise UsageError(f"--baseline {args.baseline!r} is neither a lane nor a record")
                baseline = Baseline("record", f"record {rec.get('id') or args.baseline}", record=rec)
        previous = await records.latest_passing(args.lane)
        opts = QualifyOptions(
            seed=args.seed if args.seed is not None else DEFAULT_SEED,
            determinism_tokens=args.determinism_tokens, probe_tokens=args.probe_tokens, perf=perf,
            rebaseline=args.rebaseline, allow_worse=args.allow_worse, by=args.by or whoami(),
            progress=Progress(False if args.no_progress else None),
        )
        record = await qualify(args.lane, cand, identity, engine, previous=previous, baseline=baseline, opts=opts)
        if not args.no_save:
            record["id"] = await records.save(record)
            record["stored_in"] = records.where
    finally:
        for c in opened:
            await c.close()
    if args.json:
        sys.stdout.write(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_record(record))
        if not args.no_save:
            print(f"\nrecord stored in {record['stored_in']} as {record['id']}")
    return 0 if record["passed"] else 1


def _require_a_replica(name: str, lane: Any) -> None:
    """A lane none of whose replicas accepts a connection would fail every gate after minutes: say so at
    once (exit 3). Any HTTP answer counts as reachable (the gates judge it)."""
    import httpx

    down = []
    for url in lane.replicas:
        try:
            httpx.get(url + "/v1/models", timeout=max(lane.timeouts.connect, 2.0))
            return
        except httpx.TransportError as exc:
            down.append(f"{url}: {str(exc) or type(exc).__name__}")
    raise UsageError(f"lane {name}: no replica answers ({'; '.join(down)})", 3)


def cmd_demo_lanes(args: argparse.Namespace) -> int:
    """Qualify the emulated demo lanes: the records `gateway demo` needs to serve without overrides."""
    from ..cli.main import start_emulators

    try:
        config = _load_config(args, required=True)
    except UsageError as exc:
        print(f"gateway qualify: error: {exc}", file=sys.stderr)
        return 2
    names = [n for n, lane in config.lanes.items() if lane.emulator is not None]
    if args.lane:
        if args.lane not in names:
            print(f"gateway qualify: error: {args.lane!r} is not an emulated lane of {args.routes}", file=sys.stderr)
            return 2
        names = [args.lane]
    if args.gateway:
        print("gateway qualify: error: --demo runs in-process; drop --gateway", file=sys.stderr)
        return 2
    import signal

    children = start_emulators(config)
    worst = 0
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stop the emulators too
    try:
        for name in names:
            sub = argparse.Namespace(**{**vars(args), "lane": name})
            try:
                worst = max(worst, asyncio.run(_qualify(sub)))
            except UsageError as exc:
                print(f"gateway qualify: error: {exc}", file=sys.stderr)
                worst = 2
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=10)
    return worst


def _read_record_file(ref: str) -> dict[str, Any] | None:
    path = Path(ref)
    if path.suffix == ".json" and path.is_file():
        data = orjson.loads(path.read_bytes())
        return data if isinstance(data, dict) else None
    return None


def lane_states(config: Any, routes_path: str | Path | None, records_dir: str | None = None,
                redis_url: str | None = None,
                observed: dict[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """Offline: each lane's state from routes.yaml and the records; `observed` = revisions the replicas
    reported (`gateway check --probe`), else the revision is not probed. A refused lane also gets
    `changed_fields`: what differs from its last passing record."""
    from .identity import lane_identity
    from .records import RecordIndex, open_store
    from .state import evaluate

    error = None
    try:
        index = RecordIndex(open_store(routes_path, records_dir, redis_url).summaries())
    except Exception as exc:  # noqa: BLE001
        index, error = RecordIndex(()), f"{type(exc).__name__}: {exc}"
    observed = observed or {}
    states = {name: evaluate(name, lane, index, observed.get(name), error) for name, lane in config.lanes.items()}
    for name, s in states.items():
        last = index.latest_passing_for_lane(name) if s["state"] == "unqualified" else None
        if last is not None:
            s["changed_fields"] = lane_identity(config.lanes[name], observed.get(name)).changed_fields(last.identity)
    return states


def cmd_status(args: argparse.Namespace) -> int:
    from .report import render_states

    try:
        config = _load_config(args, required=True)
    except UsageError as exc:
        print(f"gateway qualify: error: {exc}", file=sys.stderr)
        return 2
    states = lane_states(config, args.routes, args.records, args.redis)
    if args.lane:
        states = {k: v for k, v in states.items() if k == args.lane}
    if args.json:
        sys.stdout.write(orjson.dumps(states, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_states(states))
    return 1 if any(s["state"] == "unqualified" for s in states.values()) else 0


def check_extra(config: Any, routes_path: str | Path | None = None, *, observed: dict[str, str | None] | None = None,
                records_dir: str | None = None, redis_url: str | None = None) -> dict[str, dict[str, Any]]:
    """`gateway check`: one line per lane with its qualification state; returns the lanes that would be refused."""
    routes_path = routes_path or "routes.yaml"  # `gateway check` passes its file, --records and --redis
    states = lane_states(config, routes_path, records_dir, redis_url, observed)
    print("qualification:")
    for name, s in states.items():
        mark = {"qualified": "ok", "not_required": "ok", "overridden": "OVERRIDDEN",
                "unqualified": "REFUSED"}[s["state"]]
        extra = (f" (override in routes.yaml, not needed: {s['override']})"
                 if s["override"] and s["state"] == "qualified" else "")
        print(f"  {name}: {s['state']} [{mark}] {s['reason']}{extra}")
    return {name: s for name, s in states.items() if s["state"] == "unqualified"}


SUBCOMMANDS.append(register)
CHECK_EXTRAS.append(check_extra)
