"""GET /openapi.json: a small OpenAPI 3.1 description of the public endpoints.

Enough for a client generator or a schema-driven fuzzer (the tests run schemathesis against it):
the request shapes the gateway checks on its hot path, the error shape of every refusal, and the
bearer key when client keys are configured. The engines accept many more fields; the request
schemas allow additional properties, as the gateway forwards what it does not know.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from ..core.runtime import Runtime
    from ..server.security import Security

from ..core.config import EFFORT_WORDS


def _error_responses(*statuses: int, shape: str = "Error") -> dict[str, Any]:
    text = {400: "Invalid request", 401: "Missing or invalid API key", 404: "Unknown model",
            413: "Request too large", 422: "Refused by a lane limit", 429: "Too many requests",
            500: "Upstream or gateway error", 502: "Upstream unreachable",
            503: "No healthy replica or lane not qualified", 504: "Upstream timeout"}
    return {str(s): {"description": text.get(s, "Error"),
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/" + shape}}}}
            for s in statuses}


_GEN_ERRORS = (400, 401, 404, 413, 422, 429, 500, 502, 503, 504)
_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NULLABLE_STR = {"type": ["string", "null"]}


def _schemas() -> dict[str, Any]:
    """Request and answer shapes: what validate.py and passthrough.py accept, what clients get back."""
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"enum": ["text", "input_text"]}, "text": _STR}}
    image_part = {"type": "object", "required": ["type", "image_url"], "properties": {
        "type": {"const": "image_url"},
        "image_url": {"oneOf": [_STR, {"type": "object", "required": ["url"], "properties": {
            "url": _STR, "detail": {"enum": ["auto", "low", "high"]}}}]}}}
    other_part = {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["image", "input_image", "input_audio", "video_url", "file"]}}}
    part = {"oneOf": [text_part, image_part, other_part]}
    content = {"oneOf": [_STR, {"type": "array", "items": part}]}
    tool_call = {"type": "object", "required": ["function"], "properties": {
        "id": _STR, "type": {"const": "function"},
        "function": {"type": "object", "required": ["name", "arguments"], "properties": {
            "name": _STR, "arguments": {"type": "string", "description": "a JSON object, as text"}}}}}
    messages = {
        "SystemMessage": {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"enum": ["system", "developer"]}, "content": content, "name": _STR}},
        "UserMessage": {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"const": "user"}, "content": content, "name": _STR}},
        "AssistantMessage": {"type": "object", "required": ["role"], "properties": {
            "role": {"const": "assistant"}, "content": {"oneOf": [content, {"type": "null"}]},
            "reasoning_content": _NULLABLE_STR, "reasoning": _NULLABLE_STR, "name": _STR,
            "tool_calls": {"type": "array", "items": tool_call}}},
        "ToolMessage": {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"const": "tool"}, "content": content, "tool_call_id": _STR}},
        "FunctionMessage": {"type": "object", "required": ["role", "content", "name"], "properties": {
            "role": {"const": "function"}, "content": content, "name": _STR}},
    }
    tool = {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
            "description": _STR, "parameters": {"type": "object"}, "strict": {"type": "boolean"}}}}}
    usage = {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
        "prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT,
        "prompt_tokens_details": {"type": ["object", "null"], "properties": {
            "cached_tokens": {"type": ["integer", "null"]}}},
        "completion_tokens_details": {"type": ["object", "null"], "properties": {
            "reasoning_tokens": {"type": ["integer", "null"]}}}}}
    logprob: dict[str, Any] = {"type": "object", "required": ["token", "logprob"], "properties": {
        "token": _STR, "logprob": {"type": "number"}, "bytes": {"type": ["array", "null"], "items": _INT}}}
    logprob_top = {**logprob, "properties": {**logprob["properties"],
                                             "top_logprobs": {"type": "array", "items": logprob}}}
    chat_choice = {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
        "index": _INT, "finish_reason": _NULLABLE_STR,
        "message": {"type": "object", "required": ["role"], "properties": {
            "role": {"const": "assistant"}, "content": _NULLABLE_STR, "reasoning_content": _NULLABLE_STR,
            "reasoning": _NULLABLE_STR, "tool_calls": {"type": ["array", "null"], "items": tool_call}}},
        "logprobs": {"type": ["object", "null"], "properties": {
            "content": {"type": ["array", "null"], "items": logprob_top}}}}}
    return {
        **messages,
        "Message": {"oneOf": [_ref(n) for n in messages]},
        "Tool": tool,
        "Usage": usage,
        "ChatCompletion": {"type": "object", "required": ["id", "object", "created", "model", "choices"],
                           "properties": {"id": _STR, "object": {"const": "chat.completion"}, "created": _INT,
                                          "model": _STR, "choices": {"type": "array", "items": chat_choice},
                                          "usage": {"oneOf": [_ref("Usage"), {"type": "null"}]}}},
        "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
            "id": _STR, "object": {"const": "text_completion"}, "created": _INT, "model": _STR,
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "text"], "properties": {
                "index": _INT, "text": _STR, "finish_reason": _NULLABLE_STR}}},
            "usage": {"oneOf": [_ref("Usage"), {"type": "null"}]}}},
        "Response": {"type": "object", "required": ["id", "object", "model", "output", "status"], "properties": {
            "id": _STR, "object": {"const": "response"}, "created_at": {"type": "number"}, "model": _STR,
            "status": _STR, "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
            "usage": {"type": ["object", "null"], "properties": {"input_tokens": _INT, "output_tokens": _INT,
                                                                 "total_tokens": _INT}}}},
        "Embeddings": {"type": "object", "required": ["object", "data", "model"], "properties": {
            "object": {"const": "list"}, "model": _STR,
            "data": {"type": "array", "items": {"type": "object", "required": ["index", "embedding"], "properties": {
                "object": {"const": "embedding"}, "index": _INT,
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, _STR]}}}},
            "usage": _ref("Usage")}},
        "Tokens": {"type": "object", "required": ["tokens"], "properties": {
            "count": _INT, "max_model_len": _INT, "tokens": {"type": "array", "items": _INT}}},
        "Text": {"type": "object", "required": ["prompt"], "properties": {"prompt": _STR}},
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                "message": _STR, "type": _STR, "param": _NULLABLE_STR, "code": _NULLABLE_STR}}}},
        # The Anthropic Messages routes answer in Anthropic's shapes.
        "AnthropicMessage": {"type": "object", "required": ["id", "type", "role", "content", "model"], "properties": {
            "id": _STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": _STR,
            "content": {"type": "array", "items": {"type": "object", "required": ["type"]}},
            "stop_reason": _NULLABLE_STR, "usage": {"type": "object"}}},
        "TokenCount": {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": _INT}},
        "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
            "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
                "type": _STR, "message": _STR}}}},
        "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
            "id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR,
            "root": _STR, "parent": _NULLABLE_STR, "max_model_len": {"type": "integer", "minimum": 1},
            "gateway": {"type": "object", "description": "the gateway's extension", "properties": {
                "lane": _STR, "engine": _STR, "upstream_model": _STR, "fallbacks": {"type": "array", "items": _STR},
                "qualification": {"type": "object", "properties": {"state": _STR, "reason": _NULLABLE_STR}}}}}},
    }


def _sampling() -> dict[str, Any]:
    return {
        "model": {"type": "string", "minLength": 1, "description": "a public model name (GET /v1/models)"},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "presence_penalty": {"type": "number"},
        "frequency_penalty": {"type": "number"},
        "n": {"type": "integer", "minimum": 1},
        "seed": {"type": "integer"},
        "stop": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
        "user": _STR,
        "stream_options": {"type": "object", "description": "only with stream: true",
                           "properties": {"include_usage": {"type": "boolean"}}},
    }


def build(runtime: "Runtime", security: "Security | None", request: Request | None = None) -> dict[str, Any]:
    """The description; it names the public models to whoever may list them (GET /v1/models)."""
    config = runtime.snapshot.config
    keyed = security is not None and security.client_keys is not None
    sampling = _sampling()
    if _may_list_models(security, request):
        sampling["model"] = {**sampling["model"], "enum": sorted(config.models)}
    effort = {"oneOf": [{"enum": list(EFFORT_WORDS)}, {"type": "integer", "minimum": 1, "maximum": 100}],
              "description": "OpenAI's words (none turns thinking off), max, or the number the template renders; "
                             "each lane maps words to numbers (routes.yaml render.effort_map)"}
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **sampling,
            "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
            "reasoning_effort": effort,
            "tools": {"type": "array", "items": _ref("Tool")},
            "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
            "parallel_tool_calls": {"type": "boolean"},
            "response_format": {"type": "object", "required": ["type"], "properties": {
                "type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": {"type": "object"}}},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "prompt_cache_key": {"type": "string", "description": "gateway: names the conversation (not forwarded)"},
            "chat_template_kwargs": {"type": "object", "description": "thinking, reasoning_effort, drop_thinking"},
            "thinking": {"oneOf": [{"type": "boolean"}, {"type": "object", "properties": {
                "type": {"enum": ["enabled", "disabled"]}}}]},
        },
    }
    completion = {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {**sampling, "prompt": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
                       "logprobs": {"type": "integer", "minimum": 0, "maximum": 5}},
    }
    responses = {"type": "object", "required": ["model", "input"], "properties": {
        "model": sampling["model"], "stream": {"type": "boolean"},
        "input": {"oneOf": [_STR, {"type": "array", "items": {"type": "object"}}]},
        "instructions": _STR, "max_output_tokens": {"type": "integer", "minimum": 1},
        "reasoning": {"type": "object", "properties": {"effort": effort}},
        "temperature": {"type": "number"}, "top_p": {"type": "number"}, "tools": {"type": "array"}}}
    embeddings = {"type": "object", "required": ["model", "input"], "properties": {
        "model": sampling["model"],
        "input": {"oneOf": [_STR, {"type": "array", "minItems": 1, "items": _STR},
                            {"type": "array", "minItems": 1, "items": _INT}]},
        "encoding_format": {"enum": ["float", "base64"]}, "dimensions": {"type": "integer", "minimum": 1}}}
    # Anthropic's Messages API (pipeline/messages_chat.py): what check_messages reads.
    block = {"type": "object", "required": ["type"], "properties": {"type": _STR}}
    anthropic_message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["user", "assistant", "system"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": block}]}}}
    counted: dict[str, Any] = {
        "model": sampling["model"], "messages": {"type": "array", "minItems": 1, "items": anthropic_message},
        "system": {"oneOf": [_STR, {"type": "array", "items": block}]},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {"name": _STR}}},
        "thinking": {"type": "object", "properties": {"type": {"enum": ["enabled", "disabled"]}}}}
    count = {"type": "object", "required": ["model", "messages"], "properties": counted}
    messages = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
        **counted, "max_tokens": {"type": "integer", "minimum": 1}, "stream": {"type": "boolean"},
        "temperature": {"type": "number"}, "top_p": {"type": "number"}}}
    tokenize = {"type": "object", "required": ["model", "prompt"], "properties": {
        "model": sampling["model"], "prompt": _STR, "add_special_tokens": {"type": "boolean"}}}
    detokenize = {"type": "object", "required": ["model", "tokens"], "properties": {
        "model": sampling["model"], "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}

    def ok(schema: str, stream: bool) -> dict[str, Any]:
        content: dict[str, Any] = {"application/json": {"schema": _ref(schema)}}
        if stream:
            # One schema per event (as schemathesis reads SSE): `data` is a JSON chunk, or [DONE] at the end.
            content["text/event-stream"] = {"schema": {
                "type": "object", "required": ["data"], "description": "one server-sent event",
                "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}}
        return {"description": "OK", "content": content}

    def post(op_id: str, schema: dict[str, Any], summary: str, answer: str, stream: bool,
             errors: str = "Error") -> dict[str, Any]:
        return {"post": {
            "operationId": op_id, "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": ok(answer, stream), **_error_responses(*_GEN_ERRORS, shape=errors)},
        }}

    model_list = {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}}
    loose = {"type": "object"}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "lane gateway", "version": "1",
                 "description": "OpenAI-compatible gateway in front of SGLang/vLLM lanes."},
        "paths": {
            "/v1/chat/completions": post("createChatCompletion", chat, "Chat completion (optionally streamed)",
                                         "ChatCompletion", True),
            "/v1/completions": post("createCompletion", completion, "Text completion (optionally streamed)",
                                    "Completion", True),
            "/v1/responses": post("createResponse", responses, "Responses API, passed through (optionally streamed)",
                                  "Response", True),
            "/v1/messages": post("createMessage", messages, "Anthropic Messages API (optionally streamed)",
                                 "AnthropicMessage", True, errors="AnthropicError"),
            "/v1/messages/count_tokens": post("countMessageTokens", count, "A Messages request's input tokens",
                                              "TokenCount", False, errors="AnthropicError"),
            "/v1/embeddings": post("createEmbedding", embeddings, "Embeddings, passed through", "Embeddings", False),
            "/tokenize": post("tokenize", tokenize, "The engine's tokenizer", "Tokens", False),
            "/detokenize": post("detokenize", detokenize, "The engine's detokenizer", "Text", False),
            "/v1/models": {"get": {"operationId": "listModels", "responses": {
                "200": {"description": "public model names",
                        "content": {"application/json": {"schema": model_list}}},
                **_error_responses(401)}}},
            "/v1/models/{model}": {"get": {
                "operationId": "retrieveModel",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": _STR}],
                "responses": {"200": {"description": "one model", "content": {"application/json": {
                    "schema": _ref("Model")}}}, **_error_responses(401, 404)}}},
            "/healthz": {"get": {"operationId": "healthz", "security": [], "responses": {
                "200": {"description": "the process is up", "content": {"application/json": {
                    "schema": {"type": "object", "required": ["status"], "properties": {"status": _STR}}}}}}}},
            "/readyz": {"get": {"operationId": "readyz", "security": [], "responses": {
                "200": {"description": "some lane is reachable", "content": {"application/json": {"schema": loose}}},
                "503": {"description": "no lane is reachable", "content": {"application/json": {
                    "schema": loose}}}}}},
        },
        "components": {"schemas": _schemas()},
    }
    if keyed:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def _may_list_models(security: Any, request: Request | None) -> bool:
    if security is None or security.client_keys is None:
        return True
    return request is not None and security.client_verdict(request) is None


class OpenAPI:
    """GET /openapi.json: public (it describes the API; model names only to a valid client key)."""

    def __init__(self, runtime: "Runtime", security: "Security") -> None:
        self.runtime = runtime
        self.security = security

    async def route(self, request: Request) -> Response:
        return Response(orjson.dumps(build(self.runtime, self.security, request)), media_type="application/json")
