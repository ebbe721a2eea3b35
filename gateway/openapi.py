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
    from .runtime import Runtime
    from .security import Security

ROLES = ["system", "user", "assistant", "developer"]


def _error_responses(*statuses: int) -> dict[str, Any]:
    text = {400: "Invalid request", 401: "Missing or invalid API key", 404: "Unknown model",
            413: "Request too large", 422: "Refused by a lane limit", 429: "Too many requests",
            500: "Upstream or gateway error", 502: "Upstream unreachable",
            503: "No healthy replica or lane not qualified", 504: "Upstream timeout"}
    return {str(s): {"description": text.get(s, "Error"),
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for s in statuses}


_GEN_ERRORS = (400, 401, 404, 413, 422, 429, 500, 502, 503, 504)


def _message_schema() -> dict[str, Any]:
    # The common shapes only: tool results, images and the rest are accepted but not described.
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    return {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ROLES},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": part}]},
            "name": {"type": "string"},
            "reasoning_content": {"type": "string"},
        },
    }


def _sampling() -> dict[str, Any]:
    return {
        "model": {"type": "string", "minLength": 1, "description": "a public model name (GET /v1/models)"},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "n": {"type": "integer", "minimum": 1},
        "seed": {"type": "integer"},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
        "user": {"type": "string"},
    }


def build(runtime: "Runtime", security: "Security | None", request: Request | None = None) -> dict[str, Any]:
    """The description; it names the public models to whoever may list them (GET /v1/models)."""
    config = runtime.snapshot.config
    keyed = security is not None and security.client_keys is not None
    sampling = _sampling()
    if _may_list_models(security, request):
        sampling["model"] = {**sampling["model"], "enum": sorted(config.models)}
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **sampling,
            "messages": {"type": "array", "minItems": 1, "items": _message_schema()},
            "reasoning_effort": {"type": "string", "enum": ["low", "high", "max"]},
            "prompt_cache_key": {"type": "string"},
            "tools": {"type": "array", "items": {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"}}}}}},
        },
    }
    completion = {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {**sampling, "prompt": {"oneOf": [{"type": "string"},
                                                        {"type": "array", "items": {"type": "string"}}]}},
    }
    json_ok = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}},
                                                "text/event-stream": {"schema": {"type": "string"}}}}

    def generation(op_id: str, schema: dict[str, Any], summary: str) -> dict[str, Any]:
        return {"post": {
            "operationId": op_id, "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": json_ok, **_error_responses(*_GEN_ERRORS)},
        }}

    model_list = {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "lane gateway", "version": "1",
                 "description": "OpenAI-compatible gateway in front of SGLang/vLLM lanes."},
        "paths": {
            "/v1/chat/completions": generation("createChatCompletion", chat, "Chat completion (optionally streamed)"),
            "/v1/completions": generation("createCompletion", completion, "Text completion (optionally streamed)"),
            "/v1/models": {"get": {"operationId": "listModels", "responses": {
                "200": {"description": "public model names",
                        "content": {"application/json": {"schema": model_list}}},
                **_error_responses(401)}}},
            "/v1/models/{model}": {"get": {
                "operationId": "retrieveModel",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "one model", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Model"}}}}, **_error_responses(401, 404)}}},
            "/healthz": {"get": {"operationId": "healthz", "security": [], "responses": {
                "200": {"description": "the process is up", "content": {"application/json": {
                    "schema": {"type": "object"}}}}}}},
            "/readyz": {"get": {"operationId": "readyz", "security": [], "responses": {
                "200": {"description": "some lane is reachable", "content": {"application/json": {
                    "schema": {"type": "object"}}}},
                "503": {"description": "no lane is reachable", "content": {"application/json": {
                    "schema": {"type": "object"}}}}}}},
        },
        "components": {
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                        "message": {"type": "string"}, "type": {"type": "string"},
                        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}},
                "Model": {"type": "object", "required": ["id", "object"], "properties": {
                    "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                    "owned_by": {"type": "string"}}},
            },
        },
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
