"""OpenAI request bodies as pydantic models (validation and the OpenAPI schema from one place),
and the OpenAI error shape.

Unknown fields are accepted and ignored, as OpenAI-compatible servers do (clients send
user, presence_penalty, ...); fields we cannot honour with their value (n > 1) are refused.
Numbers are strict: "5" is not a max_tokens.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from sparkd.engine.errors import EngineError

Number = Annotated[float, Field(strict=True)]


class ApiError(EngineError):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Sampling(_Body):
    model: str | None = None
    max_tokens: StrictInt | None = None
    stop: str | list[str] | None = None
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)  # not OpenAI's; llama-server's and vLLM's (0: every token)
    seed: StrictInt | None = None
    n: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, Number] | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError(f"at most 4 stop sequences, found {len(v)}")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None

    def token_limit(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[StrictInt]

    def token_limit(self) -> tuple[str, int | None]:
        return "max_tokens", self.max_tokens


class CacheRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    budget: StrictInt | str = Field(description="bytes, or a size such as 8G or 512M")


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """The validated request, or a 400 ApiError naming the field and what was wrong."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"could not parse the request body as JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"could not use the request body: expected a JSON object, found {type(data).__name__}",
                       code="invalid_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ApiError(400, f"could not use field {where!r}: {err['msg']}{more}", param=where,
                       code="invalid_value") from None


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _json_response(description: str, schema: dict | None = None) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema or {"type": "object"}}}}


_ERRORS = {str(code): _json_response(why, {"$ref": "#/components/schemas/Error"}) for code, why in (
    (400, "invalid request"), (401, "missing or wrong API key"), (404, "unknown model"),
    (429, "the queue is full; retry after Retry-After seconds"), (503, "the model is not loaded"))}
_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _post(summary: str, model: type[BaseModel], stream: bool) -> dict[str, Any]:
    ok = _json_response("the reply")
    if stream:
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {"post": {"summary": summary, "security": [{"bearer": []}, {}],
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}},
                     "responses": {"200": ok, **_ERRORS}}}


def openapi_schema(title: str, version: str) -> dict[str, Any]:
    components: dict[str, Any] = {"Error": _ERROR_SCHEMA}
    for model in (ChatRequest, CompletionRequest, CacheRequest):
        schema = _schema(model)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    cache = _post("resize the expert cache", CacheRequest, stream=False)
    cache["post"]["responses"]["409"] = _json_response("no expert cache", {"$ref": "#/components/schemas/Error"})
    cache["get"] = {"summary": "the expert cache size now", "security": [{"bearer": []}, {}],
                    "responses": {"200": _json_response("cache size"), "401": _ERRORS["401"],
                                  "409": cache["post"]["responses"]["409"], "503": _ERRORS["503"]}}
    plain = {"200": {"description": "ok", "content": {"text/plain": {"schema": {"type": "string"}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/models": {"get": {"summary": "the served model", "security": [{"bearer": []}, {}],
                                   "responses": {"200": _json_response("model list"),
                                                 "401": _ERRORS["401"]}}},
            "/v1/chat/completions": _post("chat completion", ChatRequest, stream=True),
            "/v1/completions": _post("text completion", CompletionRequest, stream=True),
            "/health": {"get": {"summary": "loading | ready | error",
                                "responses": {"200": _json_response("ready"), "503": _json_response("not ready")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": plain}},
            "/admin/cache": cache,
        },
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
