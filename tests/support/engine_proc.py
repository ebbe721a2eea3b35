"""The real engine for `@pytest.mark.engine` tests: vLLM's CPU build serving the tiny random-weight
DeepSeek-tokenizer model of ../shared/engine, rendering with the gateway's own chat template.

One engine process per pytest session, started on first use on a free loopback port and stopped at
exit (process group). `ENGINE_URL=http://127.0.0.1:PORT` reuses an engine already serving with the
same flags (see `engine_command`). When the engine is not installed the tests are skipped with the
reason; when it is installed but does not come up, they fail with the tail of its log.

The engine is started the way a production vLLM lane for DeepSeek-V4.1 would be: the lane's template
(`--chat-template gateway/chat_templates/deepseek_v4.1.jinja`), DeepSeek-V4.1 tool and reasoning parsers,
prefix caching with 32-token blocks and cached-token reporting. Its KV pool is deliberately small
(POOL_BLOCKS blocks of 32 tokens) so that interleaved long conversations evict each other:
`VLLM_CPU_KVCACHE_SPACE` is a whole number of GiB (1 GiB is ~524K tokens for this model, ~30 s of
prefill to fill on 2 cores), so the pool is sized with vLLM's `--num-gpu-blocks-override` instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .gateway_proc import free_port
from .otlp_receiver import Receiver, otlp_receiver
from .poll import wait_until

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
ENGINE_DIR = SHARED / "engine"
ENGINE_HOME = Path(os.environ.get("ENGINE_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                   / "gateway-engine")
TEMPLATE = REPO / "gateway" / "chat_templates" / "deepseek_v4.1.jinja"  # package data; the same file vLLM gets

MODEL = "deepseek-v4-tiny"  # --served-model-name in serve.sh
BLOCK_SIZE = 32  # the smallest vLLM block on CPU
POOL_BLOCKS = 128  # 4,096 tokens of KV: room for any one test conversation, not for four long ones
MAX_MODEL_LEN = (POOL_BLOCKS - 1) * BLOCK_SIZE  # one sequence must fit the pool (one block is vLLM's null block)
START_TIMEOUT_S = float(os.environ.get("ENGINE_START_TIMEOUT", "240"))


KV_TOPIC = "kv"


def engine_args(kv_port: int | None = None, kv_replay_port: int | None = None) -> list[str]:
    args = ["--chat-template", str(TEMPLATE),
            "--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v41", "--reasoning-parser", "deepseek_v41",
            "--num-gpu-blocks-override", str(POOL_BLOCKS)]
    if kv_port is not None:
        # KV-cache events. vLLM binds its PUB socket only for a `*` address; on loopback it
        # connects to kv_port, which the gateway binds (`bind: true`); the replay socket it always binds.
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "topic": KV_TOPIC,
            "endpoint": f"tcp://127.0.0.1:{kv_port}", "replay_endpoint": f"tcp://127.0.0.1:{kv_replay_port}"})]
    return args


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"BLOCK_SIZE": str(BLOCK_SIZE), "MAX_MODEL_LEN": str(MAX_MODEL_LEN), "OMP_NUM_THREADS": "1",
                "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"), "PYTHONUNBUFFERED": "1",
                # vLLM's development endpoints (POST /reset_prefix_cache), on loopback: a test resets the cache.
                "VLLM_SERVER_DEV_MODE": "1"})
    return env


def engine_command(port: int, kv_port: int | None = None, kv_replay_port: int | None = None) -> list[str]:
    return [str(ENGINE_DIR / "serve.sh"), str(port), *engine_args(kv_port, kv_replay_port)]


def unavailable_reason() -> str | None:
    """Why the engine cannot be started here, or None when it can."""
    if not (ENGINE_DIR / "serve.sh").exists():
        return f"{ENGINE_DIR}/serve.sh not found (the shared/ checkout beside the repo, or GATEWAY_SHARED)"
    if not (ENGINE_HOME / "venv" / "bin" / "python").exists():
        return f"vLLM CPU engine not installed in {ENGINE_HOME} (run scripts/engine.sh)"
    if not (ENGINE_HOME / "tiny-ds" / "config.json").exists():
        return f"tiny model missing in {ENGINE_HOME}/tiny-ds (run scripts/engine.sh)"
    if not TEMPLATE.exists():
        return f"{TEMPLATE} missing"
    return None


def http_json(method: str, url: str, body: Any = None, timeout: float = 60.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


@dataclass
class EngineProc:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen | None = None  # None: an engine we did not start (ENGINE_URL)
    log_path: Path | None = None
    started_s: float = 0.0  # how long it took to answer /v1/models
    kv_endpoint: str | None = None  # its KV-event publisher (PUB), tcp://127.0.0.1:PORT
    kv_replay: str | None = None  # and replay (ROUTER) sockets
    traces: Receiver | None = None  # where it exports its OpenTelemetry spans (--otlp-traces-endpoint)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    model = MODEL
    block_size = BLOCK_SIZE
    pool_blocks = POOL_BLOCKS

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def tokenize_chat(self, messages: list, *, tools: list | None = None, **template_kwargs: Any) -> list[int] | str:
        """The engine's own render of a chat request, as token ids (or "HTTP <code>: <message>").

        vLLM's chat endpoint renames `reasoning_content` to `reasoning` before templating, its /tokenize
        endpoint does not (the template would see no reasoning): this does the rename, so the ids are
        those the chat endpoint would prefill.
        """
        messages = [_renamed(m) for m in messages]
        body: dict[str, Any] = {"model": MODEL, "messages": messages, "add_generation_prompt": True,
                                "chat_template_kwargs": template_kwargs}
        if tools is not None:
            body["tools"] = tools
        status, out = http_json("POST", self.url + "/tokenize", body)
        if status != 200:
            msg = out.get("error", {}).get("message") if isinstance(out, dict) else out
            return f"HTTP {status}: {str(msg)[:300]}"
        return out["tokens"]

    def detokenize(self, ids: list[int]) -> str:
        return http_json("POST", self.url + "/detokenize", {"model": MODEL, "tokens": ids})[1]["prompt"]

    def metrics(self) -> dict[str, float]:
        """vllm:* counters from /metrics (prefix cache queries and hits among them)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:  # noqa: S310
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and " " in line:
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
        return out

    def log(self, tail: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _renamed(m: Any) -> Any:
    if isinstance(m, dict) and "reasoning_content" in m and m.get("reasoning") is None:
        m = dict(m)
        m["reasoning"] = m.pop("reasoning_content")
    return m


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:  # noqa: S310
            return resp.status == 200
    except OSError:
        return False


def start_engine(timeout: float = START_TIMEOUT_S) -> EngineProc:
    port, kv_port, kv_replay_port = free_port(), free_port(), free_port()
    log_path = Path(tempfile.mkdtemp(prefix="engine-test-")) / "engine.log"
    # The engine exports its spans to a receiver kept for the session (the tracing test joins them to the
    # gateway's): over OTLP/HTTP, batched briefly.
    receiver = otlp_receiver()
    traces = receiver.__enter__()
    atexit.register(receiver.__exit__, None, None, None)
    command = [*engine_command(port, kv_port, kv_replay_port), "--otlp-traces-endpoint", traces.url + "/v1/traces"]
    env = dict(engine_env(), OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_BSP_SCHEDULE_DELAY="100",
               OTEL_SERVICE_NAME="vllm-engine")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log,
                                stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: stop() ends all of it
    eng = EngineProc(f"http://127.0.0.1:{port}", proc, log_path, kv_endpoint=f"tcp://127.0.0.1:{kv_port}",
                     kv_replay=f"tcp://127.0.0.1:{kv_replay_port}", traces=traces)
    atexit.register(eng.stop)

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode} before it answered; log {log_path}:\n"
                               + eng.log())
        return _ready(eng.url)

    try:
        wait_until(answers, timeout - (time.monotonic() - t0), "the engine to answer", interval=1.0,
                   detail=lambda: f"log {log_path}:\n{eng.log()}")
    except AssertionError:
        eng.stop()
        raise
    eng.started_s = time.monotonic() - t0
    return eng


_session: EngineProc | None = None
_session_error: str | None = None
_session_lock = threading.Lock()


def session_engine() -> EngineProc:
    """The session's engine (started once). Raises LookupError(reason) when it is not installed."""
    global _session, _session_error
    with _session_lock:
        if _session is not None:
            return _session
        if _session_error is not None:
            raise RuntimeError(_session_error)
        url = os.environ.get("ENGINE_URL")
        if url:
            # ENGINE_KV_EVENTS=tcp://host:PUB,tcp://host:REPLAY when that engine publishes KV events.
            kv = (os.environ.get("ENGINE_KV_EVENTS") or "").split(",")
            eng = EngineProc(url.rstrip("/"), kv_endpoint=kv[0] or None, kv_replay=kv[1] if len(kv) > 1 else None)
            if not _ready(eng.url):
                _session_error = f"ENGINE_URL={url} does not answer GET /v1/models"
                raise RuntimeError(_session_error)
            _session = eng
            os.environ.setdefault("RENDER_ENGINE_URL", eng.url)
            return _session
        reason = unavailable_reason()
        if reason:
            raise LookupError(reason)
        try:
            _session = start_engine()
        except Exception as exc:
            _session_error = str(exc)
            raise
        # tests/test_render_engine.py reuses an engine through this variable instead of starting its own.
        os.environ.setdefault("RENDER_ENGINE_URL", _session.url)
        return _session


def engine_fixture():
    """Body of a session-scoped pytest fixture: skip when not installed, fail when it will not start."""
    import pytest

    try:
        eng = session_engine()
    except LookupError as exc:
        pytest.skip(f"engine unavailable: {exc}")
    return eng


# -- the lane ------------------------------------------------------------------------------------


def engine_lane(url: str, **overrides: Any) -> dict[str, Any]:
    """A routes.yaml lane for this engine: vLLM, 32-token cache blocks, the gateway's own template."""
    lane: dict[str, Any] = {
        "engine": "vllm",
        "replicas": [url],
        "upstream_model": MODEL,
        "qualification": "not_required",
        "timeouts": {"connect": 2, "first_byte": 120, "idle": 60},
        "render": {"template": "deepseek_v4.1", "effort_map": {"low": 25, "high": 50, "xhigh": 75, "max": 100},
                   "thinking": True, "drop_thinking": True, "carry": ["reasoning_effort", "chat_template_kwargs"]},
        "effort_policy": "pin",
        "cache": {"block_size": BLOCK_SIZE, "prefill_tokens_per_s": 19000},
        "routing": "conversation_affinity",
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(lane.get(key), dict):
            lane[key] = {**lane[key], **value}
        else:
            lane[key] = value
    return lane


def engine_routes(url: str, **overrides: Any) -> dict[str, Any]:
    return {"lanes": {"dsv41-vllm-cpu": engine_lane(url, **overrides)}, "models": {"ds": "dsv41-vllm-cpu"}}
