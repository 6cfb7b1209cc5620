"""Request bodies of the OpenAI-compatible API (pydantic) and OpenAI's error shape.

Unknown fields are rejected (400) rather than silently ignored, so a client asking for something
we do not do learns it. Extensions: `speculative`, `task`, `top_k`, `ignore_eos`, `repetition_penalty`
(as in vLLM), and `response_format` types `regex` (`pattern`) and `grammar` (`grammar`, Lark).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdecode.core.tasks import TASKS
from specdecode.decoding.generation import MAX_K

MAX_STOPS = 16
MAX_N = 16  # parallel samples per request
MAX_LOGPROBS = 20  # top log-probabilities per position


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code, self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status, headers=headers)


class _Strict(BaseModel):
    """Unknown fields, NaN/inf and type coercion ("8" for an integer) are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def utf8(text: str) -> str:
    """Refuse text that is not valid Unicode (a lone surrogate escape such as \\ud800)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (found a lone surrogate escape)") from None
    return text


class Speculative(_Strict):
    enabled: bool = True
    drafter: str | None = Field(None, min_length=1, max_length=256)
    k: int | None = Field(None, ge=1, le=MAX_K)
    adaptive: bool | None = None


class JsonSchema(_Strict):
    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict = Field(..., alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's `text`, `json_object`, `json_schema`; extensions `regex` (`pattern`) and `grammar`
    (`grammar`: a Lark grammar, llguidance's dialect, start rule `start`)."""

    type: Literal["text", "json_object", "json_schema", "regex", "grammar"]
    json_schema: JsonSchema | None = None
    pattern: str | None = Field(None, min_length=1, max_length=4096)
    grammar: str | None = Field(None, min_length=1, max_length=65536)

    @model_validator(mode="after")
    def _fields(self):
        needs = {"json_schema": "json_schema", "regex": "pattern", "grammar": "grammar"}.get(self.type)
        for field in ("json_schema", "pattern", "grammar"):
            if (getattr(self, field) is not None) != (field == needs):
                raise ValueError(
                    f"type {self.type!r} " + (f"needs {field!r}" if field == needs else f"takes no {field!r}")
                )
        return self


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str | None = Field(None, max_length=512)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, strict=False)  # strict=False: an integer (1) is a float here
    top_p: float = Field(1.0, gt=0, le=1, strict=False)
    top_k: int = Field(0, ge=-1, description="0 or -1: no top-k filter")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    presence_penalty: float = Field(0.0, ge=-2, le=2, strict=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, strict=False)
    repetition_penalty: float = Field(1.0, gt=0, le=10, strict=False)
    response_format: ResponseFormat | None = None
    ignore_eos: bool = False
    speculative: Speculative | None = None
    task: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return [utf8(s) for s in stops]

    @field_validator("task")
    @classmethod
    def _task(cls, v):
        if v is not None and v not in TASKS:
            raise ValueError(f"unknown task {v!r}; known: {', '.join(TASKS)}")
        return v


class CompletionRequest(_Common):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] = Field(
        ..., description="text, token ids, or a list of one text"
    )
    echo: Literal[False] = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; else how many top alternatives per position."""
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], str):
                if len(v) != 1:
                    raise ValueError("only one prompt per request (n=1, no batch of prompts)")
                v = v[0]
        if isinstance(v, str) and not v:
            raise ValueError("prompt must not be empty")
        return utf8(v) if isinstance(v, str) else v


class TextPart(_Strict):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, v):
        if isinstance(v, dict) and v.get("type") != "text":
            raise ValueError(f"only text content parts are supported, not {v.get('type')!r}")
        return v

    @field_validator("text")
    @classmethod
    def _text(cls, v):
        return utf8(v)


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return utf8(v) if isinstance(v, str) else v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # without logprobs: true, a 400 (app.py)

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
