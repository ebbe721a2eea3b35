"""Property-based fuzzing of the gateway's HTTP API (hypothesis, and schemathesis on /openapi.json).

Whatever arrives, through the real gateway in front of the emulator: never a 5xx, never a hang
(every call has a client timeout and a bound on how long it may take), every 4xx in OpenAI's error
shape, every stream that starts ends with [DONE]. Inputs: arbitrary JSON, near-valid requests
with one field of the wrong type, huge strings, deep nesting, odd unicode and invalid UTF-8,
header junk, random paths and methods, and junk below HTTP (that one only has to get an answer
or a closed connection, never a hang or a 5xx: it never reaches the API).

Example counts are bounded so the whole file runs in about a minute on two cores.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
import schemathesis
from schemathesis import checks
from hypothesis import HealthCheck, event, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes

KEY = "sk-fuzz-client-key-5b1e"
ADMIN = "fuzz-admin-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 2_000_000
SLOW_S = 15.0  # no answer may take longer than this (the lane's timeouts are shorter)
MESSAGES = "/v1/messages"  # Anthropic's API: its own error and stream shapes

FUZZ = settings(max_examples=60, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def emu():
    with run_emulator(flavour="vllm", output_tokens=4, reasoning_tokens=2, max_model_len=4096) as e:
        yield e


@pytest.fixture(scope="module")
def gw(emu):
    fuzzed = lane(emu.url, timeouts={"connect": 2, "first_byte": 10, "idle": 5}, breaker={"failures": 1000},
                  limits={"max_output_tokens": 256, "max_context_tokens": 4096})
    cfg = routes({"l": fuzzed, "raw": {**fuzzed, "render": {"template": None}}}, {"m": "l", "raw-m": "raw"},
                 max_request_bytes=MAX_BODY, client_keys={"env": "FUZZ_CLIENT_KEYS"}, admin_key_env="FUZZ_ADMIN_KEY")
    with run_gateway(cfg, env={"FUZZ_CLIENT_KEYS": KEY, "FUZZ_ADMIN_KEY": ADMIN}) as g:
        yield g


@pytest.fixture(scope="module")
def http(gw):
    with httpx.Client(base_url=gw.url, timeout=httpx.Timeout(SLOW_S + 5)) as c:
        yield c


def check(resp: httpx.Response, took: float, *, streamed: bool = False, path: str = "") -> None:
    """The properties every answer must have (in Anthropic's shapes on the Messages routes)."""
    event(f"HTTP {resp.status_code}")
    assert took < SLOW_S, f"took {took:.1f}s"
    assert resp.status_code < 500, f"{resp.status_code}: {resp.text[:500]}"
    anthropic = path.startswith(MESSAGES)
    if resp.status_code >= 400:
        check_error(resp, anthropic)
    elif streamed and "text/event-stream" in resp.headers.get("content-type", ""):
        events = [line for line in resp.text.splitlines() if line.startswith("data:")]
        if anthropic:
            assert events and json.loads(events[-1][5:])["type"] in ("message_stop", "error"), resp.text[-300:]
        else:
            assert events and events[-1].strip() == "data: [DONE]", resp.text[-300:]


def check_error(resp: httpx.Response, anthropic: bool) -> None:
    """OpenAI's error shape, or Anthropic's."""
    try:
        body = resp.json()
        err = body["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{resp.status_code} not in an error shape: {resp.text[:300]!r}") from None
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if anthropic:
        assert body["type"] == "error" and set(err) == {"type", "message"}, body
        return
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str)


def post(http: httpx.Client, path: str, content: bytes, headers: dict | None = None) -> None:
    t0 = time.monotonic()
    r = http.post(path, content=content, headers={"Content-Type": "application/json", **AUTH, **(headers or {})})
    check(r, time.monotonic() - t0, streamed=True, path=path)


# -- strategies ------------------------------------------------------------------------------------

odd_chars = st.characters(codec=None)  # every code point, surrogates included
odd_text = st.one_of(
    st.text(odd_chars, max_size=40),
    st.sampled_from(["\u202e\u202d", "\ufeff", "\x00", "\ud800", "\udfff", "\U0010ffff", "\ufffe\uffff",
                     "e\u0301" * 50, "🧑‍🚀" * 20, "<｜begin▁of▁sentence｜>", "<｜deepseek_image｜>", "<think>",
                     "</think>", "\r\n\r\n", "data: [DONE]\n\n", "{\"error\": 1}", "\\u0000"]),
)
ints = st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-10**40, 10**40), st.sampled_from([0, -1, 2**31, 2**64]))
floats = st.floats(allow_nan=True, allow_infinity=True)
leaf = st.one_of(st.none(), st.booleans(), ints, floats, odd_text)
any_json = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(odd_text, inner, max_size=4)), max_leaves=25)


def dumps(value) -> bytes:
    """Python's encoder: keeps lone surrogates as \\u escapes, NaN and Infinity, integers of any size."""
    return json.dumps(value, allow_nan=True, ensure_ascii=True).encode()


FIELDS = ["model", "messages", "stream", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "n",
          "tools", "tool_choice", "logprobs", "top_logprobs", "reasoning_effort", "stream_options", "response_format",
          "chat_template_kwargs", "prompt_cache_key", "user", "seed", "thinking", "logit_bias", "extra_body",
          "prompt", "echo", "suffix", "best_of"]


def valid_chat(stream: bool = False) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}


@st.composite
def near_valid(draw) -> dict:
    """A valid request with a few fields replaced (or added) by arbitrary JSON, or one message mangled."""
    body = valid_chat(draw(st.booleans()))
    body["model"] = draw(st.sampled_from(["m", "raw-m"]))
    for _ in range(draw(st.integers(1, 3))):
        body[draw(st.sampled_from(FIELDS))] = draw(any_json)
    if draw(st.booleans()) and isinstance(body.get("messages"), list):
        msg = {"role": draw(st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "developer"]), any_json)),
               "content": draw(st.one_of(odd_text, any_json, st.lists(st.fixed_dictionaries(
                   {"type": st.sampled_from(["text", "image_url", "bogus"]), "text": any_json}), max_size=3)))}
        for key in draw(st.lists(st.sampled_from(["reasoning_content", "tool_calls", "name", "tool_call_id"]),
                                 max_size=2)):
            msg[key] = draw(any_json)
        body["messages"] = body["messages"] + [msg]
    return body


# -- hypothesis over the API ---------------------------------------------------------------------------


@FUZZ
@given(value=any_json, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", MESSAGES,
                                             MESSAGES + "/count_tokens"]))
def test_arbitrary_json_bodies(http, value, path) -> None:
    post(http, path, dumps(value))


MESSAGE_FIELDS = ["model", "messages", "max_tokens", "stream", "system", "tools", "tool_choice", "thinking",
                  "temperature", "top_p", "top_k", "stop_sequences", "metadata", "output_config",
                  "chat_template_kwargs"]


@st.composite
def near_valid_messages(draw) -> dict:
    """A valid Messages request with a few fields replaced (or added) by arbitrary JSON, or one block mangled."""
    body = {"model": draw(st.sampled_from(["m", "raw-m"])), "max_tokens": 4, "stream": draw(st.booleans()),
            "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(draw(st.integers(1, 3))):
        body[draw(st.sampled_from(MESSAGE_FIELDS))] = draw(any_json)
    if draw(st.booleans()) and isinstance(body.get("messages"), list):
        blocks = draw(st.lists(st.fixed_dictionaries({
            "type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "document", "bogus"]),
            **{k: any_json for k in draw(st.lists(st.sampled_from(["text", "id", "name", "input", "content",
                                                                   "tool_use_id", "thinking", "source"]),
                                                  max_size=3))}}), max_size=3))
        role = draw(st.one_of(st.sampled_from(["user", "assistant", "system"]), any_json))
        body["messages"] = body["messages"] + [{"role": role, "content": blocks}]
    return body


@FUZZ
@given(body=near_valid_messages(), path=st.sampled_from([MESSAGES, MESSAGES, MESSAGES + "/count_tokens"]))
def test_near_valid_messages_requests(http, body, path) -> None:
    post(http, path, dumps(body))


@FUZZ
@given(body=near_valid(), path=st.sampled_from(["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"]))
def test_near_valid_requests_with_wrong_types(http, body, path) -> None:
    if path == "/v1/completions" and "prompt" not in body:
        body["prompt"] = body.pop("messages", "hi")
    post(http, path, dumps(body))


@settings(FUZZ, max_examples=12)
@given(size=st.sampled_from([10_000, 200_000, 1_000_000, MAX_BODY - 200, MAX_BODY + 1, 3_000_000]),
       where=st.sampled_from(["content", "model", "key", "stop", "tool_name", "user"]),
       char=st.sampled_from(["a", "é", "🧑", "\u0000", " "]))
def test_huge_strings(http, size, where, char) -> None:
    body = valid_chat()
    big = char * (size // max(1, len(char.encode())))
    if where == "content":
        body["messages"][0]["content"] = big
    elif where == "model":
        body["model"] = big
    elif where == "key":
        body[big] = 1
    elif where == "stop":
        body["stop"] = [big]
    elif where == "tool_name":
        body["tools"] = [{"type": "function", "function": {"name": big, "parameters": {}}}]
    else:
        body["user"] = big
    post(http, "/v1/chat/completions", json.dumps(body, ensure_ascii=False).encode())


@settings(FUZZ, max_examples=20)
@given(depth=st.one_of(st.integers(1, 600), st.sampled_from([1023, 1024, 1025, 5000, 100_000])),
       shape=st.sampled_from(["list", "dict", "in_content", "in_tools", "in_kwargs"]))
def test_deep_nesting(http, depth, shape) -> None:
    if shape == "list":
        raw = "[" * depth + "]" * depth
    elif shape == "dict":
        raw = '{"a":' * depth + "1" + "}" * depth
    else:
        inner = "[" * depth + "]" * depth
        field = {"in_content": None, "in_tools": "tools", "in_kwargs": "chat_template_kwargs"}[shape]
        if field is None:
            raw = '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": ' + inner + "}]}"
        else:
            raw = ('{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "'
                   + field + '": {"x": ' + inner + "}}")
    post(http, "/v1/chat/completions", raw.encode())


@FUZZ
@given(text=odd_text, encoding=st.sampled_from(["escaped", "utf8", "utf8-surrogatepass", "latin1", "bom"]),
       stream=st.booleans(), where=st.sampled_from(["content", "system", "model", "stop", "cache_key"]))
def test_odd_unicode(http, text, encoding, stream, where) -> None:
    body = valid_chat(stream)
    if where == "content":
        body["messages"][0]["content"] = f"say {text} please"
    elif where == "system":
        body["messages"].insert(0, {"role": "system", "content": text})
    elif where == "model":
        body["model"] = text
    elif where == "stop":
        body["stop"] = [text] if text else None
    else:
        body["prompt_cache_key"] = text
    if encoding == "escaped":
        raw = json.dumps(body, ensure_ascii=True).encode()
    elif encoding == "bom":
        raw = b"\xef\xbb\xbf" + json.dumps(body, ensure_ascii=True).encode()
    else:
        s = json.dumps(body, ensure_ascii=False)
        raw = s.encode({"utf8": "utf-8", "utf8-surrogatepass": "utf-8", "latin1": "latin-1"}[encoding.split("-")[0]],
                       "surrogatepass" if encoding == "utf8-surrogatepass" else "replace")
    post(http, "/v1/chat/completions", raw)


header_name = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~"),
                      min_size=1, max_size=30)
# Every byte a header value may carry on the wire (control characters are junk below HTTP, tested apart).
header_value = st.binary(max_size=200).map(lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127).strip())
KNOWN_HEADERS = ["Authorization", "X-Api-Key", "Content-Type", "X-Request-Id", "X-Conversation-Id",
                 "X-Gateway-Repin", "X-Gateway-Qualify", "Accept", "Accept-Encoding", "Content-Encoding",
                 "Cookie", "Host", "X-Forwarded-For", "Expect", "Connection", "Te", "Upgrade", "X-Admin-Key"]


@FUZZ
@given(junk=st.dictionaries(st.one_of(st.sampled_from(KNOWN_HEADERS), header_name), header_value, max_size=6),
       stream=st.booleans(), keep_auth=st.booleans(),
       path=st.sampled_from(["/v1/chat/completions", "/v1/models", "/metrics", "/admin/api/overview?probe=0"]))
def test_header_junk(gw, junk, stream, keep_auth, path) -> None:
    headers = [(b"Content-Type", b"application/json")]
    if keep_auth:
        headers.append((b"Authorization", AUTH["Authorization"].encode()))
    headers += [(k.encode(), v) for k, v in junk.items()]
    t0 = time.monotonic()
    with httpx.Client(base_url=gw.url, timeout=SLOW_S + 5) as c:
        method = "POST" if path.startswith("/v1/chat") else "GET"
        try:
            r = c.request(method, path, content=dumps(valid_chat(stream)) if method == "POST" else None,
                          headers=headers)
        except httpx.RemoteProtocolError:
            return  # the server refused the framing itself (e.g. Content-Length junk): not the API
        except httpx.UnsupportedProtocol:
            return
        except httpx.DecodingError:
            return  # junk Accept-Encoding/Content-Encoding confusing the client, not the server
    if r.status_code == 400 and not r.headers.get("content-type", "").startswith("application/json"):
        return  # uvicorn's own answer to an unparseable request (e.g. a junk Host), below the API
    check(r, time.monotonic() - t0, streamed=True)


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
       path=st.one_of(
           st.sampled_from(["/", "/v1", "/v1/", "/v1/chat", "/v1/chat/completions/", "/v1/models/", "/v1/embeddings",
                            "/admin/api/records?limit=abc", "/admin/api/records?limit=1e309&since=-inf",
                            "/admin/api/stats?window_s=nan", "/admin/api/charts?buckets=-1",
                            "/admin/static/..%2f..%2fetc%2fpasswd", "/admin/drift?since=x",
                            "/admin/conversations/%00", "/qualify/records?id=..%2F..", "/qualify/state",
                            "/metrics", "/openapi.json", "/readyz", "/healthz"]),
           st.text(st.characters(codec="ascii", categories=("L", "N", "P", "S")), max_size=60).map(lambda s: "/" + s),
           # Any code point a URL can carry (as UTF-8, percent-encoded): a lone surrogate has no bytes,
           # so the client cannot send it at all (httpx raises before a request exists).
           st.text(st.characters(codec="utf-8"), max_size=20).map(lambda s: "/v1/models/" + s)),
       admin=st.booleans())
def test_paths_and_methods(http, method, path, admin) -> None:
    headers = {**AUTH, **({"X-Admin-Key": ADMIN} if admin else {})}
    t0 = time.monotonic()
    try:
        r = http.request(method, path, headers=headers, content=b"{}" if method in ("POST", "PUT", "PATCH") else None)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol):
        return  # the client would not send it
    if method == "HEAD":
        assert r.status_code < 500
        return
    check(r, time.monotonic() - t0)


@settings(FUZZ, max_examples=40)
@given(junk=st.binary(min_size=1, max_size=300), prefix=st.sampled_from([b"", b"POST /v1/chat/completions HTTP/1.1\r\n",
                                                                          b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"]))
def test_junk_below_http_gets_an_answer_or_a_close(gw, junk, prefix) -> None:
    port = int(gw.url.rsplit(":", 1)[1])
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(prefix + junk + b"\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert time.monotonic() - t0 < 6, "the server hung on junk"
    if data.startswith(b"HTTP/1.1 "):
        status = int(data[9:12])
        assert status < 500, data[:300]


def test_gateway_still_serves_after_fuzzing(http, gw) -> None:
    r = http.post("/v1/chat/completions", json=valid_chat(), headers=AUTH)
    assert r.status_code == 200, r.text
    assert "Traceback" not in gw.log(), gw.log()[-3000:]


# -- schemathesis on the gateway's own OpenAPI description ------------------------------------------


def test_openapi_describes_the_public_api(http) -> None:
    doc = http.get("/openapi.json", headers=AUTH).json()
    assert doc["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}"} <= set(doc["paths"])
    assert doc["security"] == [{"bearer": []}]
    assert KEY not in json.dumps(doc)
    model = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert model["properties"]["model"]["enum"] == ["m", "raw-m"]  # a client with a key may list them
    anonymous = httpx.get(http.base_url.join("/openapi.json"), timeout=10).json()
    schema = anonymous["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "enum" not in schema["properties"]["model"]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schemathesis(gw, mode) -> None:
    schema = schemathesis.openapi.from_url(gw.url + "/openapi.json", headers=AUTH)  # with a key: names the models
    generation = schemathesis.GenerationMode(mode)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 6
    ran = []
    for op in operations:
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=generation))
        def run(case) -> None:
            t0 = time.monotonic()
            resp = case.call(base_url=gw.url, headers=AUTH, timeout=SLOW_S + 5)
            took = time.monotonic() - t0
            assert took < SLOW_S, f"{case.method} {case.path} took {took:.1f}s"
            event(f"{case.method} {case.path} -> {resp.status_code}")
            assert resp.status_code < 500, f"{case.method} {case.formatted_path}: {resp.status_code} {resp.text[:300]}"
            if 400 <= resp.status_code < 500 and case.method != "HEAD":
                check_error(resp, case.path.startswith(MESSAGES))
            # The other way round: what comes back is what the description says (status, type, schema).
            case.validate_response(resp, checks=[checks.response_schema_conformance, checks.content_type_conformance,
                                                 checks.status_code_conformance])

        try:
            run()
        except Unsatisfiable:
            # Negative mode has nothing to break in an operation without parameters or body.
            assert mode == "negative" and op.path in ("/healthz", "/readyz", "/v1/models"), op.path
            continue
        ran.append(op.path)
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models/{model}", "/v1/responses", "/v1/embeddings",
            "/tokenize", "/detokenize", MESSAGES, MESSAGES + "/count_tokens"} <= set(ran)
