"""The OpenAI wire format: request bodies (validated) and response bodies.

Requests are pydantic models with `extra="forbid"`, as OpenAI's own API rejects an unrecognized
argument. Parameters of the OpenAI API that avkit accepts but does not implement take only their
neutral value (n=1, logprobs off, penalties 0); anything else is a 400 naming the field.
Limits that depend on the server (max_tokens ceiling, context length) are checked by the app.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted for client compatibility, neutral values only.
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)

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
    best_of: Literal[1] = 1
    logprobs: Literal[0] | None = None
    suffix: None = None


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_template_dict(self) -> dict[str, Any]:
        """A dict for the chat template; list content (OpenAI 'parts') is joined to its text."""
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if isinstance(self.content, list):
            parts = [p.get("text", "") for p in self.content if p.get("type") == "text"]
            d["content"] = "".join(parts)
        else:
            d["content"] = self.content or ""
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


class ChatCompletionRequest(_SamplingParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: None = None
    response_format: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v):
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(f"only type 'text' is supported, got {v.get('type')!r}")
        return v


# ---- responses -------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish_reason: str | None,
                    use: dict[str, int] | None, *, chunk: bool = False) -> dict[str, Any]:
    """A /v1/completions response, or one SSE chunk of it (chunks carry no usage unless asked)."""
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def chat_body(rid: str, model: str, text: str, finish_reason: str | None,
              use: dict[str, int]) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": use}


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish_reason: str | None,
               use: dict[str, int] | None = None) -> dict[str, Any]:
    choices = [] if use is not None else [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices}
    if use is not None:
        body["usage"] = use
    return body


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error envelope; the openai client surfaces `message`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def model_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "avkit"}]}
