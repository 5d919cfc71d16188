"""`avkit serve` on bad input (issue 15 item 4-5, issue 22 item 9): every class answers in OpenAI's
error envelope with the field named, never a 500 with exception text, and the connection stays usable.
A real uvicorn server on 127.0.0.1 with the tiny random pair; raw httpx so the bytes are ours.
The table of these classes is in tests/README.md (## serve)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve_support import running_server


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    with running_server(pair, tmp_path_factory.mktemp("serve_state"), max_body_bytes=64 * 1024) as (url, state):
        yield url, state


def _envelope(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, r.text
    return err


CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"


@pytest.mark.parametrize("path, body, status, param, words", [
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400, "messages",
     "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages", "only 'text' parts"),
    (CHAT, {"messages": [{"role": "user", "content": "a\ud800b"}]}, 400, "messages.0.content", "surrogate"),
    (COMPL, {"prompt": "a\ud800b"}, 400, "prompt", "surrogate"),
    (COMPL, {"prompt": "x", "logprobs": 2}, 400, "logprobs", "not supported"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, "logprobs", "not supported"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, 400, "top_logprobs",
     "not supported"),
    (COMPL, {"prompt": "x", "repetition_penalty": 1.2}, 400, "repetition_penalty", "not supported"),
    (COMPL, {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    (COMPL, {"prompt": "x", "best_of": 3}, 400, "best_of", "not supported"),
    (COMPL, {"prompt": "x", "n": 0}, 400, "n", "n"),
])
def test_bad_bodies_get_a_400_naming_the_field(server, path, body, status, param, words):
    raw = json.dumps({"model": "tiny", **body})  # ASCII JSON: a lone surrogate travels as \ud800
    r = httpx.post(server[0] + path, content=raw, headers={"content-type": "application/json"})
    err = _envelope(r)
    assert r.status_code == status and err["param"] == param and words in err["message"], r.text


def test_neutral_values_of_unsupported_fields_are_accepted(server):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "repetition_penalty": 1,
            "presence_penalty": 0, "frequency_penalty": 0, "logprobs": 0, "best_of": 1, "logit_bias": {}}
    assert httpx.post(server[0] + COMPL, json=body).status_code == 200


@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v1/nothing", 404, "no route /v1/nothing"),
    ("GET", COMPL, 405, "method GET not allowed"),
    ("DELETE", "/v1/models", 405, "method DELETE not allowed"),
])
def test_404_and_405_in_the_envelope(server, method, path, status, words):
    r = httpx.request(method, server[0] + path)
    assert r.status_code == status and words in _envelope(r)["message"]


def test_invalid_utf8_is_a_400_in_the_envelope(server):
    r = httpx.post(server[0] + COMPL, content=b'{"model": "tiny", "prompt": "\xff\xfe"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and _envelope(r)["type"] == "invalid_request_error", r.text


def test_body_over_the_cap_is_413_declared_or_chunked(server):
    big = b'{"model": "tiny", "prompt": "' + b"a" * (70 * 1024) + b'"}'
    r = httpx.post(server[0] + COMPL, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "65536" in _envelope(r)["message"]

    def chunks():  # no Content-Length: the cap counts what arrives
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    r = httpx.post(server[0] + COMPL, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and _envelope(r)["code"] == 413


def test_a_500_keeps_the_keep_alive_connection_and_echoes_nothing(server, monkeypatch):
    url, state = server

    def boom(*a, **k):
        raise RuntimeError("secret /srv/models/path")

    monkeypatch.setattr(state.tokenizer, "encode", boom)
    with httpx.Client(base_url=url) as c:
        r = c.post(COMPL, json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 500 and "/srv" not in r.text and "RuntimeError" not in r.text
        assert _envelope(r)["type"] == "internal_error"
        monkeypatch.undo()
        again = c.post(COMPL, json={"model": "tiny", "prompt": "x", "max_tokens": 2})  # same connection
        assert again.status_code == 200, again.text


def test_tokenizing_a_huge_prompt_does_not_stall_health(pair, tmp_path):
    """Tokenization runs in a worker thread that releases the GIL: /health answers meanwhile. (With the
    GIL-holding `encode` on the event loop, one /health call waited for the whole tokenization.)"""
    prompt = "the quick brown fox 12345 " * 200_000  # 5.2 MB: > 1 s of BPE for the tiny tokenizer on a fast host
    with running_server(pair, tmp_path, max_body_bytes=8 * 2**20) as (url, _):
        result = {}

        def post():
            t0 = time.monotonic()
            result["r"] = httpx.post(url + COMPL, json={"model": "tiny", "prompt": prompt}, timeout=120)
            result["s"] = time.monotonic() - t0

        t = threading.Thread(target=post)
        t.start()
        gaps = []
        with httpx.Client(base_url=url, timeout=30) as c:
            while t.is_alive() and len(gaps) < 500:
                t0 = time.monotonic()
                assert c.get("/health").status_code == 200
                gaps.append(time.monotonic() - t0)
        t.join()
    assert result["r"].status_code == 400 and "context limit" in result["r"].json()["error"]["message"]
    took = result["s"]
    assert took > 1.0 and len(gaps) >= 5 and max(gaps) < took / 3, (took, gaps)


def test_n_choices_with_the_openai_client(server):
    import openai  # lazy: heavy, imported by the tests that use it
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=8, temperature=1.0, n=3, seed=5)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # independent samples (8 tokens from a ~3-nat distribution: equal by chance ~e^-24)
    assert 3 <= out.usage.completion_tokens <= 24  # summed over the choices, as OpenAI counts
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          n=2, stream=True, stream_options={"include_usage": True})
    parts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in chat:
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert sorted(finishes) == [0, 1] and usage.completion_tokens >= 2
    greedy = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=6, n=2, temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content  # greedy: both the argmax path


@pytest.mark.parametrize("extra", [{"top_k": 1}, {"min_p": 1.0}, {"top_k": 1, "min_p": 0.3}])
def test_top_k_and_min_p_reach_the_verifier(server, extra):
    """top_k = 1 (or min_p = 1) keeps only the most probable token: sampling at T = 1 must then give the
    greedy text exactly, through speculative decoding (drafts from the untruncated draft distribution)."""
    import openai  # lazy: heavy, imported by the tests that use it
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    greedy = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=16, temperature=0)
    sampled = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=16, temperature=1.0, top_p=1.0,
                                        extra_body=extra)
    assert sampled.choices[0].text == greedy.choices[0].text and len(greedy.choices[0].text) > 0
    loose = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=16, temperature=1.0, seed=3,
                                      extra_body={"top_k": 50, "min_p": 0.01})
    assert loose.usage.completion_tokens >= 1
