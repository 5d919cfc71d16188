"""Property (issue 15): any body POSTed to the generation endpoints gets a 2xx, or a 4xx in OpenAI's
error envelope; never a 5xx, never a dropped connection; the server is still serving afterwards.

Three generators: arbitrary JSON values, bodies built from the real field names with values of any
JSON type (the paths past the parser: validation, tokenization, limits, generation), and raw bytes.
A real uvicorn server on 127.0.0.1 with the tiny random pair; bounded by max_examples.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_support import running_server

ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
          "seed", "n", "stream", "stream_options", "user", "presence_penalty", "frequency_penalty", "logit_bias",
          "logprobs", "top_logprobs", "top_k", "min_p", "repetition_penalty", "echo", "best_of", "suffix", "tools",
          "tool_choice", "response_format", "parallel_tool_calls", "unknown_field"]

# Text as JSON can carry it: lone surrogates (\ud800) and control characters included.
texts = st.text(st.characters(categories=["Cs", "Cc", "Lu", "Ll", "Nd", "Zs", "Po", "So"]), max_size=40)
scalars = st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=True, allow_infinity=True) | texts
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "wizard"])},
    optional={"content": texts | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10) | st.integers()}),
        max_size=2) | st.none() | st.integers(), "name": st.text(max_size=5)}), max_size=3)
field_values = {
    "model": st.sampled_from(["tiny", "other"]) | json_values,
    "prompt": texts | st.lists(st.integers(-2, 400), max_size=6) | json_values,
    "messages": messages | json_values,
    "max_tokens": st.integers(-1, 6) | json_values,
    "max_completion_tokens": st.integers(-1, 6),
    "temperature": st.floats(-1, 3) | json_values,
    "top_p": st.floats(-0.5, 1.5),
    "n": st.integers(-1, 6),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6) | json_values,
    "seed": st.integers(-1, 2**64),
    "top_k": st.integers(-2, 5),
    "logprobs": st.booleans() | st.integers(-1, 3),
}


@st.composite
def near_valid(draw, path: str) -> dict:
    """A valid body for `path` (tiny model, 1-4 tokens), then up to 5 fields set to values of any kind."""
    body = {"model": "tiny", "max_tokens": draw(st.integers(1, 4))}
    if path == "/v1/completions":
        body["prompt"] = draw(texts)
    else:
        body["messages"] = [{"role": "user", "content": draw(texts)}]
    for key in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=5)):
        body[key] = draw(field_values.get(key, json_values))
    return body


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    with running_server(pair, tmp_path_factory.mktemp("serve_state"), max_concurrency=4,
                        queue_size=64) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        yield url, client


def _check(client: httpx.Client, path: str, content: bytes) -> None:
    with client.stream("POST", path, content=content, headers={"content-type": "application/json"}) as r:
        body = r.read()
        assert r.status_code < 500, (r.status_code, body[:500], content[:300])
        if r.status_code >= 400:
            err = json.loads(body)["error"]
            assert isinstance(err["message"], str) and err["message"] and err["code"] == r.status_code, body
            return
        assert 200 <= r.status_code < 300
        if r.headers["content-type"].startswith("text/event-stream"):
            lines = [ln for ln in body.decode().split("\n") if ln.startswith("data: ")]
            assert lines[-1] == "data: [DONE]", lines[-3:]
        else:
            assert json.loads(body)["choices"], body


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@PROPERTY
@given(path=st.sampled_from(ENDPOINTS), body=json_values)
def test_any_json_value(server, path, body):
    _check(server[1], path, json.dumps(body).encode())


@PROPERTY
@given(data=st.data(), path=st.sampled_from(ENDPOINTS))
def test_bodies_from_the_real_fields(server, data, path):
    _check(server[1], path, json.dumps(data.draw(near_valid(path))).encode())


@PROPERTY
@given(path=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=80))
def test_raw_bytes(server, path, raw):
    _check(server[1], path, raw)


def test_still_serving_afterwards(server):
    client = server[1]
    assert client.get("/health").json()["status"] == "ok"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
