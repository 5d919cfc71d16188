"""`avkit serve` end to end: a real uvicorn server on 127.0.0.1 with tiny random models, driven by
the official `openai` client (completions, chat, streaming) and httpx (errors, auth, 429, disconnects).

The draft is the target's weights scaled by 0.25/0.3 (same seed, smaller init std), so acceptance is
high but not 1 and every branch of verification runs. Oracles: target-only greedy decoding by the
engine without a draft, and the exact next-token marginals of the target under HF transformers.
"""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
import torch

from avkit.config import SamplingConfig
from avkit.runtime.engine import Engine, EngineConfig
from avkit.runtime.request import Request
from avkit.scheduling.policy import FullVerification
from avkit.scheduling.spec import POLICIES
from avkit.serve.server import bind_warning, build_state
from serve_support import PROMPTS, VOCAB, metrics, running_server, serve_config, serve_process, wait_for

_config, _server, _metrics, _wait = serve_config, running_server, metrics, wait_for


def _greedy_reference(target, prompt_ids: list[int], n: int):
    """Target-only greedy decoding (no draft, K = 0): the output the server must reproduce."""
    engine = Engine(target, None, EngineConfig(k=0, concurrency=1, max_len=192))
    [gen] = engine.generate([Request("ref", prompt_ids, SamplingConfig(temperature=0.0, max_new_tokens=n))])
    return gen


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    with _server(pair, tmp_path_factory.mktemp("serve_state")) as (url, state):
        yield url, state


@pytest.fixture(scope="module")
def client(server):
    import openai  # lazy: heavy, imported by the tests that use it
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = httpx.get(server[0] + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_completion_equals_target_only_decoding(pair, client, prompt):
    tok = pair[2].tokenizer
    ref = _greedy_reference(pair[2], tok.encode(prompt), 20)
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0)
    assert out.choices[0].text == tok.decode(ref.output_ids, skip_special_tokens=True)
    assert out.usage.completion_tokens == len(ref.output_ids)
    assert out.usage.prompt_tokens == len(ref.prompt_ids)
    assert out.choices[0].finish_reason == ref.finish_reason


def test_greedy_chat_and_streaming_equal_target_only_decoding(pair, client):
    tok = pair[2].tokenizer
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add two numbers"}]
    ref = _greedy_reference(pair[2], tok.apply_chat_template(messages), 16)
    expected = tok.decode(ref.output_ids, skip_special_tokens=True)
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    assert out.choices[0].message.content == expected and out.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    assert chunks[-1].usage.completion_tokens == len(ref.output_ids)


def test_hybrid_drafter_greedy_equals_target_only_decoding(pair, tmp_path):
    """--drafter hybrid (suffix cache + draft model): a repetitive prompt makes cache drafts likely."""
    import openai  # lazy: heavy, imported by the tests that use it
    tok = pair[2].tokenizer
    prompt = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\n"
    ref = _greedy_reference(pair[2], tok.encode(prompt), 24)
    with _server(pair, tmp_path, drafter="hybrid") as (url, state):
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(2):  # the second run also drafts from the global cache of the first response
            out = c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
            assert out.choices[0].text == tok.decode(ref.output_ids, skip_special_tokens=True)
        assert type(state.make_engine().drafter).__name__ == "HybridDrafter"
        m = _metrics(url)
        assert m.get(("avkit_drafted_total", (("drafter", "suffix"), ("position", "0"))), 0) > 0


def test_seeded_sampling_is_reproducible_streamed_or_not(pair, tmp_path):
    """Under the `full` policy every step drafts and verifies K: the path, hence the sample, is fixed by the
    seed. (Adaptive verification is best effort here, as OpenAI's seed: its budget depends on the batch
    and its draft gate on the traffic before the request.)"""
    import openai  # lazy: heavy, imported by the tests that use it
    kw = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": 24, "temperature": 0.9, "top_p": 0.9,
          "seed": 7}
    with _server(pair, tmp_path, policy="full") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        a = client.completions.create(**kw).choices[0].text
        b = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
        other = client.completions.create(**{**kw, "seed": 8}).choices[0].text
    assert a == b and len(a) > 0
    assert other != a  # 24 sampled tokens from a ~3-nat distribution: a collision has odds ~e^-70


def test_stop_sequence_truncates(pair, client):
    tok = pair[2].tokenizer
    full = tok.decode(_greedy_reference(pair[2], tok.encode(PROMPTS[0]), 20).output_ids,
                      skip_special_tokens=True)
    stop = full[len(full) // 2:len(full) // 2 + 2]
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                    stop=[stop])
    assert out.choices[0].text == full[:full.find(stop)] and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, status, field", [
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 121}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "n": 5}, 400, "n"),  # n choices decode at once: at most max_concurrency (4)
    ({"prompt": "x", "top_k": -2}, 400, "top_k"),
    ({"prompt": "x", "min_p": 1.5}, 400, "min_p"),
    ({"prompt": "x", "max_tokens_typo": 3}, 400, "max_tokens_typo"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": [1, 2, VOCAB + 5]}, 400, "prompt"),
    ({"prompt": [5] * 187}, 400, "prompt"),  # context limit: max_len 192 - (K + 1)
    ({"prompt": [5] * 100, "max_tokens": 120}, 400, "max_tokens"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
])
def test_bad_completion_requests_name_the_field(server, body, status, field):
    r = httpx.post(server[0] + "/v1/completions", json={"model": "tiny", **body})
    err = r.json()["error"]
    assert r.status_code == status, r.text
    assert err["param"] == field and field in err["message"]


@pytest.mark.parametrize("raw, field", [
    (b'{"model": "tiny", "messages": [', None),  # malformed JSON
    (json.dumps({"model": "tiny", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                 "max_completion_tokens": -1}).encode(), "max_completion_tokens"),
])
def test_bad_chat_requests(server, raw, field):
    r = httpx.post(server[0] + "/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field
    assert ("JSON" in err["message"]) if field is None else (field in err["message"])


def test_metrics_count_drafts_per_position(server, client):
    client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=24, temperature=1.0, seed=1)
    m = _metrics(server[0])
    for i in range(4):
        key = (("drafter", "model"), ("position", str(i)))
        drafted, verified = m[("avkit_drafted_total", key)], m[("avkit_verified_total", key)]
        assert drafted >= verified >= m[("avkit_accepted_total", key)] >= 0
    assert m[("avkit_drafted_total", (("drafter", "model"), ("position", "0")))] > 0
    assert m[("avkit_verify_budget_count", ())] > 0 and m[("avkit_step_seconds_count", ())] > 0
    assert m[("avkit_spec_decode_step_time_actual_over_predicted_count", ())] > 0  # the cost model's error
    assert m[("avkit_generation_tokens_total", ())] >= 24
    assert m[("avkit_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))] >= 1
    assert ("avkit_estimator_slope", ()) in m  # adaptive verification with the online estimator
    assert ("avkit_estimator_intercept", (("position", "3"),)) in m
    assert m[("avkit_queue_depth", ())] == 0


def test_api_key_required_except_health(pair, tmp_path):
    import openai  # lazy: heavy, imported by the tests that use it
    with _server(pair, tmp_path, api_key="sekret") as (url, _):
        assert httpx.get(url + "/health").status_code == 200
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(url + path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens >= 1
    assert bind_warning(_config(pair, tmp_path, host="0.0.0.0")) is not None
    assert bind_warning(_config(pair, tmp_path, host="0.0.0.0", api_key="k")) is None
    assert bind_warning(_config(pair, tmp_path, host="::1")) is None


def _long_prompt(pair, n):
    """A prompt whose greedy continuation does not hit EOS within n tokens (so it stays in flight)."""
    tok = pair[2].tokenizer
    for p in PROMPTS + [p + " x" for p in PROMPTS]:
        if _greedy_reference(pair[2], tok.encode(p), n).finish_reason == "length":
            return p
    pytest.fail("no prompt runs to max_tokens greedily")  # the fixed seeds make this deterministic


def _generated(url: str) -> float:
    return _metrics(url)[("avkit_generation_tokens_total", ())]


def test_queue_bound_429_and_disconnect_frees_slots(pair, tmp_path):
    import asyncio

    prompt = _long_prompt(pair, 120)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 120, "temperature": 0}
    with _server(pair, tmp_path, max_concurrency=1, queue_size=1) as (url, _):
        # A burst of 6 while the first one decodes 120 tokens: 1 runs, 1 waits, the rest get 429.
        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                return await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(6)])

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert codes.count(429) >= 1 and codes.count(200) >= 2 and set(codes) == {200, 429}, codes
        assert all(r.json()["usage"]["completion_tokens"] == 120 for r in responses if r.status_code == 200)
        rejected = next(r for r in responses if r.status_code == 429)
        assert int(rejected.headers["retry-after"]) >= 0
        assert rejected.json()["error"]["type"] == "rate_limit_error"

        # Clients that go away: a decoding stream and a queued stream; neither runs to the end.
        def health():
            return httpx.get(url + "/health").json()

        before = _generated(url)
        stream = {**body, "stream": True}
        with httpx.Client(base_url=url, timeout=30) as c1, httpx.Client(base_url=url, timeout=30) as c2, \
                c1.stream("POST", "/v1/completions", json=stream) as running:
            next(running.iter_lines())  # decoding now
            with c2.stream("POST", "/v1/completions", json=stream) as queued:
                assert queued.status_code == 200
        assert _wait(lambda: health() == {"status": "ok", "running": 0, "queued": 0}), health()
        assert _generated(url) - before < 120  # cancelled mid-way, and the queued one never ran

        # A non-streaming client that times out is cancelled too.
        before = _generated(url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.05))
        assert _wait(lambda: health()["running"] == 0), health()
        assert _generated(url) - before < 120
        ok = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


class _FailFirstStep(FullVerification):
    """A verify policy whose first call raises: an internal error inside an engine step."""

    name = "fail_first_step"
    failed = False

    def num_verify(self, batch, load):
        if not _FailFirstStep.failed:
            _FailFirstStep.failed = True
            raise RuntimeError("injected failure")
        return super().num_verify(batch, load)


def test_engine_error_fails_that_request_with_500_and_server_keeps_serving(pair, tmp_path, monkeypatch):
    import openai  # lazy: heavy, imported by the tests that use it
    monkeypatch.setitem(POLICIES._entries, "fail_first_step", _FailFirstStep)
    with _server(pair, tmp_path, policy="fail_first_step") as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError, match="server log") as info:
            c.completions.create(model="tiny", prompt="x", max_tokens=8, temperature=0)
        assert "injected" not in info.value.message and "RuntimeError" not in info.value.message
        again = c.completions.create(model="tiny", prompt="x", max_tokens=8, temperature=0)
        assert again.usage.completion_tokens >= 1
        m = _metrics(url)
        assert m[("avkit_engine_errors_total", ())] == 1
        assert httpx.get(url + "/health").json() == {"status": "ok", "running": 0, "queued": 0}


def _chi2_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[bool, float, int]:
    """Pearson χ² after merging bins with expected count < 5; pass if χ² < df + 10·sqrt(2·df)."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.r_[counts[~small], counts[small].sum()]
    exp = np.r_[expected[~small], expected[small].sum()]
    keep = exp > 0
    chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return chi2 < df + 10 * math.sqrt(2 * df), chi2, df


def test_lossless_through_the_servers_engine_configuration(pair, tmp_path):
    """Sampled tokens 1 and 2 follow the target's exact marginals with adaptive verification on."""
    import transformers

    state = build_state(_config(pair, tmp_path, max_concurrency=32), target=pair[2], draft=pair[3])
    engine = state.make_engine()  # the engine exactly as the server builds it (adaptive policy)
    assert type(engine.policy).__name__ == "AdaptiveVerification"
    prompt = pair[2].tokenizer.encode(PROMPTS[0])
    n = 800
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=3)
    gens = engine.generate([Request(f"chi2-{i}", prompt, sampling) for i in range(n)])
    first = np.array([g.output_ids[0] for g in gens])
    second = np.array([g.output_ids[1] for g in gens if len(g.output_ids) > 1])

    hf = transformers.AutoModelForCausalLM.from_pretrained(pair[0]).eval()  # independent oracle
    with torch.no_grad():
        p0 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
        ext = torch.cat([torch.tensor(prompt).expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], 1)  # [V, L+1]
        p1_given = torch.softmax(hf(ext).logits[:, -1].double(), -1)  # [V, V]
    eos = sorted(pair[2].tokenizer.eos_token_ids)
    p1_given[eos] = 0.0  # a request that stopped at EOS has no second token
    p1 = p0 @ p1_given  # [V]
    for tokens, probs in ((first, p0), (second, p1 / p1.sum())):
        ok, chi2, df = _chi2_ok(np.bincount(tokens, minlength=VOCAB), probs.numpy())
        assert ok, f"chi2 {chi2:.1f} with {df} df"
    assert engine.stats.steps > 0 and state.engine_loop.num_running == 0


def _refused(url: str) -> bool:
    try:
        return httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 503
    except httpx.TransportError:  # the listener is closed
        return True


def test_sigterm_finishes_in_flight_snapshots_and_flushes_trace(pair, tmp_path):
    """`avkit serve` as a process: SIGTERM mid-stream -> the stream completes, snapshot + trace, exit 0."""
    import signal

    from avkit.trace.reader import read_traces

    snap, trace = tmp_path / "snap.json", tmp_path / "serve.parquet"
    args = ["--snapshot", str(snap), "--snapshot-every", "2", "--refit-interval", "3", "--record", str(trace),
            "--max-new-tokens", "120", "--grace-period", "20"]
    with serve_process(pair, *args) as (proc, url):
        body = {"model": "tiny", "prompt": _long_prompt(pair, 48), "max_tokens": 48, "temperature": 0,
                "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            first = next(lines)
            proc.send_signal(signal.SIGTERM)
            assert _wait(lambda: _refused(url))  # stops admitting while the stream goes on
            rest = [ln for ln in lines if ln]
        chunks = [json.loads(ln[6:]) for ln in [first, *rest] if ln.startswith("data: {")]
        assert rest[-1] == "data: [DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=60) == 0, proc.communicate()[1][-2000:]
    coeffs = json.loads(snap.read_text())
    assert coeffs["num_positions"] == 4 and len(coeffs["intercepts"]) == 4 and coeffs["slope"] > 0
    assert coeffs["refits"] >= 2 and coeffs["rounds"] >= 2  # 48 greedy tokens take > 6 steps
    rows = read_traces([trace])
    assert len(rows) > 0 and set(rows["dataset"].unique()) == {"serve"}
    # positions < K = 4 (the adaptive policy may stop drafting early, so not every depth appears)
    assert 0 <= rows["position"].min() and rows["position"].max() <= 3
    assert not (tmp_path / "serve.parquet.partial").exists()


def test_restart_resumes_from_the_snapshot(pair, tmp_path):
    state = build_state(_config(pair, tmp_path), target=pair[2], draft=pair[3])
    est = state.make_engine().policy.estimator
    est.slope, est.intercepts[:] = 0.61, [0.5, 0.25, 0.0, -0.25]
    from avkit.serve.side_writes import coefficients_of
    from avkit.staged import write_json_atomic

    write_json_atomic(tmp_path / "snap.json", coefficients_of(est))
    resumed_state = build_state(_config(pair, tmp_path), target=pair[2], draft=pair[3])
    resumed = resumed_state.make_engine().policy.estimator
    assert resumed.slope == 0.61 and resumed.intercepts.tolist() == [0.5, 0.25, 0.0, -0.25]
    deployed = {**coefficients_of(est), "slope": 0.7}
    write_json_atomic(tmp_path / "deployed.json", deployed)
    fresh = build_state(_config(pair, tmp_path, resume=False, coefficients=str(tmp_path / "deployed.json")),
                        target=pair[2], draft=pair[3])
    assert fresh.make_engine().policy.estimator.slope == 0.7  # --no-resume: the deployed file
