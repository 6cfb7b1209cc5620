"""Request bodies of the OpenAI-compatible API (pydantic) and OpenAI's error shape.

Unknown fields are rejected (400) rather than silently ignored, so a client asking for something
we do not do (logprobs, n > 1, penalties) learns it. Extensions: `speculative`, `task`, `top_k`,
`ignore_eos` (as in vLLM).
"""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from specdecode.core.generation import MAX_K
from specdecode.core.tasks import TASKS

MAX_STOPS = 16


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status: int, message: str, type: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status, headers=headers)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Speculative(_Strict):
    enabled: bool = True
    drafter: str | None = Field(None, min_length=1, max_length=256)
    k: int | None = Field(None, ge=1, le=MAX_K)
    adaptive: bool | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str | None = Field(None, max_length=512)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, description="0 or -1: no top-k filter")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    presence_penalty: float = Field(0.0, ge=0, le=0, description="not supported: must be 0")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="not supported: must be 0")
    logprobs: Literal[False] | None = None
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
        return stops

    @field_validator("task")
    @classmethod
    def _task(cls, v):
        if v is not None and v not in TASKS:
            raise ValueError(f"unknown task {v!r}; known: {', '.join(TASKS)}")
        return v


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] = Field(..., description="text, token ids, or a list of one text")
    echo: Literal[False] = False

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
        return v


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
