"""The OpenAI wire format: request bodies (validated, `extra="forbid"`; fields avkit cannot apply losslessly are
accepted at their neutral value only) and response bodies (docs/runtime.md, "Serving")."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

UNSUPPORTED = "not supported by avkit serve"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # field -> (its neutral values, why nothing else is accepted); checked by `_neutral_only`
    NEUTRAL: ClassVar[dict[str, tuple[tuple, str]]] = {}

    @field_validator("*")
    @classmethod
    def _neutral_only(cls, v, info):
        """A field of NEUTRAL is accepted at its neutral value(s) only; otherwise a 400 that says why."""
        rule = cls.NEUTRAL.get(info.field_name)
        if rule is not None and v is not None and v not in rule[0]:
            raise ValueError(f"{info.field_name}={v!r} is {UNSUPPORTED}: {rule[1]}")
        return v


_NO_LOGPROBS = "token log-probabilities are not returned"


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingParams(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extra sampling fields that the verifier applies to the target distribution (lossless).
    top_k: int | None = Field(default=None, ge=-1)  # -1 or 0 = off
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)  # 0 = off
    # Accepted for client compatibility, neutral values only: a penalty depends on the tokens generated
    # so far, drafts included, and the verifier does not apply it.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM
    logit_bias: dict[str, float] | None = None
    NEUTRAL: ClassVar = {"presence_penalty": ((0,), "only 0 (no penalty)"),
                         "frequency_penalty": ((0,), "only 0 (no penalty)"),
                         "repetition_penalty": ((1,), "only 1.0 (no penalty)"),
                         "logit_bias": (({},), "only an empty map")}

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if v is None:
            return []
        v = [v] if isinstance(v, str) else v
        if len(v) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(v)}")
        if any(not 0 < len(s) <= 256 for s in v):
            raise ValueError("stop sequences must have 1 to 256 characters")
        return v


class CompletionRequest(_SamplingParams):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's legacy default
    echo: Literal[False] = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: None = None
    NEUTRAL: ClassVar = {**_SamplingParams.NEUTRAL, "logprobs": ((0,), _NO_LOGPROBS),
                         "best_of": ((1,), "use n for several samples")}


class TextPart(_Strict):
    """One part of a message's content: avkit serves text models, so text parts only."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v):
        """One clear message per bad part (pydantic's union errors would name the `str` branch)."""
        if not isinstance(v, list):
            return v
        for i, part in enumerate(v):
            if not isinstance(part, dict):
                raise ValueError(f"part {i} must be an object, got {type(part).__name__}")
            if part.get("type") != "text":
                raise ValueError(f"part {i} has type {part.get('type')!r}: only 'text' parts are supported "
                                 "(avkit serves text models)")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i}: text must be a string, got {type(part.get('text')).__name__}")
        return v

    def as_template_dict(self) -> dict[str, Any]:
        """A dict for the chat template; list content (OpenAI 'parts') is joined to its text."""
        content = "".join(p.text for p in self.content) if isinstance(self.content, list) else self.content or ""
        given = {key: getattr(self, key) for key in ("name", "tool_calls", "tool_call_id")
                 if getattr(self, key) is not None}
        return {"role": "system" if self.role == "developer" else self.role, "content": content, **given}


class ChatCompletionRequest(_SamplingParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    NEUTRAL: ClassVar = {**_SamplingParams.NEUTRAL, "logprobs": ((False,), _NO_LOGPROBS),
                         "top_logprobs": ((0,), _NO_LOGPROBS)}

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v):
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(f"only type 'text' is supported, got {v.get('type')!r}")
        return v


# ---- responses -------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(rid: str, model: str, chat: bool, choices: list[tuple[Any, str | None]],
                  use: dict[str, int] | None, *, chunk: bool = False, index: int = 0) -> dict[str, Any]:
    """A /v1/completions or /v1/chat/completions body [(text, finish_reason) per choice], or one SSE chunk of it
    (choices numbered from `index`, a chat chunk's content is its delta dict; a chunk carries usage only
    when given one)."""
    def choice(i: int, content, finish: str | None) -> dict[str, Any]:
        key, value = ("text", content) if not chat else ("delta", content) if chunk else \
            ("message", {"role": "assistant", "content": content})
        return {"index": index + i, key: value, "logprobs": None, "finish_reason": finish}

    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    body = {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice(i, *c) for i, c in enumerate(choices)]}
    if use is not None or not chunk:
        body["usage"] = use
    return body


INTERNAL_ERROR = "internal error; the server log has the details"  # a 500 never echoes the exception
ENGINE_DEAD = "the engine stopped on an internal error; the server log has the details"
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error", 500: "internal_error",
               503: "unavailable_error"}  # OpenAI's error type by HTTP status; any other: invalid_request_error


class ApiError(Exception):
    """An HTTP error; `body()` is OpenAI's envelope (the openai client surfaces `message`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.status}}
