"""Cost tables (avkit/scheduling/cost.py, roofline.py, profile.py)."""

import json
import math
from dataclasses import replace

import numpy as np
import torch
import pytest

from avkit.config import ProfileConfig, SamplingConfig
from avkit.errors import ConfigError
from avkit.hvd.cost import in_forwards
from avkit.scheduling.cost import CostTable, isotonic, resolve_cost, shape_keys


def _table(**kw):
    d = {"verify_tokens": (1, 4, 16), "verify_ms": (2.0, 2.0, 8.0), "draft_requests": (1, 8), "draft_ms": (1.0, 1.5)}
    d.update(kw)
    return CostTable(**d)


def test_interpolation_and_extrapolation():
    t = _table()
    np.testing.assert_allclose(t.verify_cost([0, 1, 2, 10, 16, 20]), [2.0, 2.0, 2.0, 5.0, 8.0, 10.0])
    # autoregressive drafter: k passes of draft_ms(n); parallel: one pass
    np.testing.assert_allclose(t.draft_cost([1, 8], [7, 7]) + t.context_cost([1, 8]), [7.0, 10.5])
    par = _table(drafter="parallel", context_ms=(0.5, 1.0))
    np.testing.assert_allclose(par.draft_cost([1, 8, 8], [7, 7, 0]) + par.context_cost([1, 8, 8]), [1.5, 2.5, 1.0])
    np.testing.assert_allclose(t.step_cost(1, 3, 4), 5.0)


def test_draft_fixed_part_is_paid_once_per_drafting_step():
    t = _table(draft_fixed_ms=(3.0, 5.0))  # e.g. vLLM's first pass over the tokens verified last step
    np.testing.assert_allclose(t.draft_pass_cost([1, 8]), [1.0, 1.5])
    np.testing.assert_allclose(t.draft_fixed_cost([1, 4.5, 8]), [3.0, 4.0, 5.0])
    # k = 0 drafts nothing and pays nothing; k > 0: k passes + the fixed part once (brute force per cell)
    n, k = np.array([1, 1, 8, 8, 4.5]), np.array([0, 3, 0, 7, 2])
    want = [0.0 if kk == 0 else kk * np.interp(nn, [1, 8], [1.0, 1.5]) + np.interp(nn, [1, 8], [3.0, 5.0])
            for nn, kk in zip(n, k)]
    np.testing.assert_allclose(t.draft_cost(n, k), want)
    np.testing.assert_allclose(t.step_cost(1, 3, 4), 2.0 + 3.0 + 3.0)
    par = _table(drafter="parallel", draft_fixed_ms=(3.0, 5.0))  # one pass + the fixed part
    np.testing.assert_allclose(par.draft_cost([1, 1], [0, 7]), [0.0, 4.0])
    np.testing.assert_allclose(_table().draft_fixed_cost([1, 8]), [0.0, 0.0])  # absent: 0 (native tables)


def test_draft_fixed_part_is_validated(tmp_path):
    path = tmp_path / "bad.json"
    base = {"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1, 2], "draft_ms": [1.0, 1.0]}
    for fixed, match in (([1.0], "draft_fixed needs equal"), ([2.0, 1.0], "draft_fixed must be non-decreasing"),
                         ([1.0, "x"], r"field 'draft_fixed_ms'\[1\] must be a finite number")):
        path.write_text(json.dumps({**base, "draft_fixed_ms": fixed}))
        with pytest.raises(ConfigError, match=match):
            CostTable.load(path)
    path.write_text(json.dumps({**base, "draft_fixed_ms": []}))  # empty: no fixed part
    assert CostTable.load(path).draft_fixed_cost(2) == 0.0


def test_drafter_prefill_curve_prices_catch_up_and_falls_back_to_draft_passes(tmp_path):
    path = tmp_path / "bad.json"
    base = {"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1, 16], "draft_ms": [1.0, 4.0]}
    for tokens, ms, match in (([16, 64], [1.0], "prefill needs equal"), ([16, 64], [2.0, 1.0],
                              "prefill must be non-decreasing"), ([16], [], "prefill needs equal"),
                              ([16, 8], [1.0, 2.0], "strictly increasing")):
        path.write_text(json.dumps({**base, "prefill_tokens": tokens, "prefill_ms": ms}))
        with pytest.raises(ConfigError, match=match) as e:
            CostTable.load(path)
        assert "bad.json" in str(e.value)
    path.write_text(json.dumps({**base, "prefill_tokens": [16, 64], "prefill_ms": [2.0, 5.0]}))
    t = CostTable.load(path)
    np.testing.assert_allclose(t.draft_prefill_cost([16, 40, 128]), [2.0, 3.5, 9.0])  # last slope beyond
    assert CostTable.load(t.save(tmp_path / "c.json")).to_json() == t.to_json()
    plain = CostTable.load(path.write_text(json.dumps(base)) and path)  # none profiled: a draft pass over n rows
    np.testing.assert_allclose(plain.draft_prefill_cost([1, 16, 31]), plain.draft_pass_cost([1, 16, 31]))


def test_json_round_trip(tmp_path):
    t = _table(context_ms=(0.1, 0.2), meta={"device": "test"}, draft_fixed_ms=(0.5, 0.7))
    path = t.save(tmp_path / "sub" / "cost.json")
    back = CostTable.load(path)
    assert back.to_json() == t.to_json()
    assert [p.name for p in path.parent.iterdir()] == ["cost.json"]  # no temp file left behind
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # a plain file's mode, not mkstemp's 0600


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    (json.dumps({"verify_tokens": [1]}), "missing key 'verify_ms'"),
    (json.dumps({"verify_tokens": [1, 2], "verify_ms": [3.0, 1.0], "draft_requests": [1], "draft_ms": [1.0]}),
     "verify must be non-decreasing"),
    (json.dumps({"verify_tokens": [2, 1], "verify_ms": [1.0, 1.0], "draft_requests": [1], "draft_ms": [1.0]}),
     "strictly increasing"),
    (json.dumps({"verify_tokens": [1], "verify_ms": ["x"], "draft_requests": [1], "draft_ms": [1.0]}),
     r"field 'verify_ms'\[0\] must be a finite number, got 'x'"),
    ('{"verify_tokens": [1], "verify_ms": [NaN], "draft_requests": [1], "draft_ms": [1.0]}',
     r"field 'verify_ms'\[0\] must be a finite number, got nan"),
    ('{"verify_tokens": [1], "verify_ms": [1e400], "draft_requests": [1], "draft_ms": [1.0]}',
     r"field 'verify_ms'\[0\] must be a finite number, got inf"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [0.0], "draft_requests": [1], "draft_ms": [1.0]}),
     "field 'verify_ms' must be positive"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [-1.0]}),
     "draft ms must be finite and >= 0"),
    (json.dumps({"verify_tokens": [1.5], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0]}),
     r"field 'verify_tokens'\[0\] must be an integer, got 1.5"),
    (json.dumps({"verify_tokens": [True], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0]}),
     r"field 'verify_tokens'\[0\] must be an integer, got True"),
    (json.dumps({"verify_tokens": [], "verify_ms": [], "draft_requests": [1], "draft_ms": [1.0]}),
     "field 'verify_tokens' must be a non-empty list"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0, 2.0], "draft_requests": [1], "draft_ms": [1.0]}),
     "verify needs equal"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "meta": {"k": "7"}}), "field 'meta.k' must be a non-negative integer, got '7'"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "meta": {"target": 3}}), "field 'meta.target' must be a string, got 3"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "drafter": "tree"}), "drafter must be one of"),
    (json.dumps([1, 2]), "expected a JSON object, got list"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "shape_scale": [[1, 0, 0, 1, 0, 2]]}), r"field 'shape_scale'\[0\] must be 7 numbers"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "shape_scale": [[1, 0, 0, 1, 0, 2, 0.0]]}), r"field 'shape_scale'\[0\] must be 7 numbers"),
    (json.dumps({"verify_tokens": [1], "verify_ms": [1.0], "draft_requests": [1], "draft_ms": [1.0],
                 "shape_scale": {"a": 1}}), "field 'shape_scale' must be a list of lists"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_bad_tables_name_the_file(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=match) as e:
        CostTable.load(path)
    assert "bad.json" in str(e.value)


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        resolve_cost("/nonexistent/cost.json")


def test_no_cost_given_prices_with_the_profiled_table_else_the_cpu_roofline(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_cost("") == resolve_cost("roofline:cpu:1.5b")
    _table(verify_ms=(3.0, 3.0, 9.0)).save(tmp_path / ".cache" / "avkit" / "cost.json")  # `avkit profile`'s path
    assert resolve_cost(None).verify_ms == (3.0, 3.0, 9.0)


@pytest.mark.parametrize("seed", range(8))
def test_isotonic_is_sklearns_isotonic_regression(seed):
    """Pool adjacent violators against sklearn's IsotonicRegression (the oracle), weighted and not, with ties."""
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    y = np.round(np.cumsum(rng.normal(0.5, 2.0, n)), 1)  # a rising curve with spikes and dips (and ties)
    w = rng.uniform(0.1, 3.0, n)
    x = np.arange(n)
    np.testing.assert_allclose(isotonic(y), IsotonicRegression().fit_transform(x, y), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(isotonic(y, w), IsotonicRegression().fit(x, y, sample_weight=w).predict(x),
                               rtol=1e-12, atol=1e-12)
    assert isotonic([1.0, 9.0, 2.0, 3.0, 4.0]).tolist() == [1.0, 4.5, 4.5, 4.5, 4.5]  # a spike is averaged
    assert isotonic([]).size == 0


def test_catch_up_prices_all_but_the_last_lagging_token():
    """lag <= 2: free (the first pass feeds it); else the drafter's prefill of lag - 1 tokens, below the
    prefill grid a draft pass over that many rows; without a prefill curve every price is a draft pass."""
    t = _table(draft_requests=(1, 16), draft_ms=(1.0, 4.0), prefill_tokens=(16, 64), prefill_ms=(2.0, 5.0))
    lag = np.array([0, 1, 2, 3, 10, 17, 41, 129])
    want = [0, 0, 0, 1.0 + 3 * 1 / 15, 1.0 + 3 * 8 / 15, 2.0, 3.5, 9.0]
    np.testing.assert_allclose(t.catch_up_cost(lag), want)
    np.testing.assert_allclose(_table().catch_up_cost([2, 3, 9]), [0.0, *_table().draft_pass_cost([2, 8])])


def test_context_length_moves_the_kv_read():
    """context_cost at the table's context is the curve; each cached token beyond it adds kv_ms_per_token,
    each one short of it takes it off (the roofline's KV read is linear in the context)."""
    t = _table(context_ms=(0.5, 4.0), context_len=100, kv_ms_per_token=0.01)
    np.testing.assert_allclose(t.context_cost([1, 8]), [0.5, 4.0])
    np.testing.assert_allclose(t.context_cost([1, 8], [100, 800]), [0.5, 4.0])
    np.testing.assert_allclose(t.context_cost([1, 8], [300, 0]), [2.5, -4.0])
    np.testing.assert_allclose(t.step_cost(1, 0, 4, 300) - t.step_cost(1, 0, 4), 2.0)
    short, long = (resolve_cost(f"roofline:H200:8b:context={c}") for c in (1024, 8192))
    np.testing.assert_allclose(short.context_cost([1, 64], [8192, 64 * 8192]), long.context_cost([1, 64]), rtol=1e-9)


def test_unit_view_divides_every_price():
    t = _table(draft_fixed_ms=(0.5, 0.7), prefill_tokens=(16, 64), prefill_ms=(2.0, 5.0), kv_ms_per_token=0.1,
               context_len=10)
    u = in_forwards(t)
    n, k, tok, lag = np.array([1, 3, 8]), np.array([0, 2, 5]), np.array([1, 7, 20]), np.array([2, 30, 100])
    np.testing.assert_allclose(u.step_cost(n, k, tok, 50 * n), t.step_cost(n, k, tok, 50 * n) / 2.0)
    np.testing.assert_allclose(u.catch_up_cost(lag), t.catch_up_cost(lag) / 2.0)


@pytest.mark.parametrize("name", ["avkit_cost_cpu.json", "adaptive_live_cost_amx.json", "cost_dense_T0.json",
                                  "engine_peer_cost_T1.json", "vllm_cost_cpu.json"])
def test_shipped_cost_files_still_load(name):
    """Files written before context_len, kv_ms_per_token and noise were fields: the reader takes meta's
    context_len and prices them as before (no context term)."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "bench" / "results" / name
    raw = json.loads(path.read_text())
    t = CostTable.load(path)
    assert t.context_len == raw["meta"].get("context_len", 0) and t.kv_ms_per_token == 0.0
    np.testing.assert_allclose(t.verify_cost(raw["verify_tokens"]), raw["verify_ms"])
    assert t.context_cost(4, 4 * 99999).item() == t.context_cost(4).item()


def test_roofline_shape_h200_8b():
    t = resolve_cost("roofline:H200:8b:context=8192")
    # memory-bound at small batches: verifying 8 tokens costs about what 1 token costs
    assert t.verify_cost(8) / t.verify_cost(1) < 1.02
    # compute-bound at large batches: linear in tokens (2*P FLOPs per token at ~790 TFLOP/s)
    slope = (t.verify_cost(4096) - t.verify_cost(2048)) / 2048
    assert slope == pytest.approx((2 * 8.03e9 + 4 * 32 * 32 * 128 * 8192) / 790e12 * 1e3, rel=0.02)
    # KV reads scale with requests: 8192 tokens x 128 KiB per token at 4.3 TB/s
    assert t.context_cost(1) == pytest.approx(8192 * 2 * 32 * 8 * 128 * 2 / 4.3e12 * 1e3, rel=0.01)
    assert np.all(np.diff(t.verify_ms) >= 0) and np.all(np.diff(t.draft_ms) >= 0)


def test_roofline_orders_accelerators_and_models():
    h200, a100 = resolve_cost("roofline:H200:8b"), resolve_cost("roofline:A100:8b")
    assert (h200.verify_cost([1, 4096]) < a100.verify_cost([1, 4096])).all()
    b70 = resolve_cost("roofline:H200:70b")
    assert b70.verify_cost(1) > 5 * h200.verify_cost(1)


@pytest.mark.parametrize("spec, match", [
    ("roofline:H999:8b", "unknown accelerator"),
    ("roofline:H200:3b", "unknown target model"),
    ("roofline:H200", "roofline:GPU:MODEL"),
    ("roofline:H200:8b:context=abc", "context must be an integer"),
    ("roofline:H200:8b:colour=red", "unknown option"),
])
def test_roofline_spec_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        resolve_cost(spec)


def test_roofline_context_env(monkeypatch):
    monkeypatch.setenv("AVKIT_PROFILE_CONTEXT_LEN", "1024")
    assert resolve_cost("roofline:H200:8b").meta["context_len"] == 1024


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from avkit.models import load
    from avkit.models.testing import write_tiny_model

    root = tmp_path_factory.mktemp("models")
    tgt = load(write_tiny_model(root / "t", vocab=300, seed=0, hidden=64, layers=2))
    drf = load(write_tiny_model(root / "d", vocab=300, seed=1, hidden=32, layers=1, heads=2, kv_heads=1))
    return tgt, drf, root


def test_profile_tiny_model_is_monotone(tiny_pair, monkeypatch, tmp_path):
    from avkit.scheduling.profile import PRICE_GRID, profile_costs

    monkeypatch.setenv("AVKIT_PROFILE_CONTEXT_LEN", "64")
    cfg = ProfileConfig(k=3, max_verify_tokens=12, max_requests=3, repeats=2, warmup=1)
    table = profile_costs(*tiny_pair[:2], cfg)
    assert table.verify_tokens == tuple(range(1, 13)) and table.draft_requests == (1, 2, 3)  # dense: a staircase
    assert table.prefill_tokens == PRICE_GRID and len(table.prefill_ms) == len(PRICE_GRID)
    assert np.all(np.diff(table.verify_ms) >= 0) and np.all(np.diff(table.draft_ms) >= 0)
    assert np.all(np.diff(table.prefill_ms) >= 0) and min(table.prefill_ms) >= 0  # differences of two steps
    assert min(table.verify_ms) > 0 and table.meta["context_len"] == 64
    assert len(table.request_ms) == 3 and table.request_ms[0] == 0.0 and np.all(np.diff(table.request_ms) >= 0)
    assert table.meta["target_sha256"] == tiny_pair[0].sha256
    back = CostTable.load(table.save(tmp_path / "c.json"))
    assert back.verify_ms == table.verify_ms and back.request_ms == table.request_ms


def test_profile_times_the_engines_own_step_with_exactly_its_tokens(tiny_pair):
    """Each profiled point is one Engine.step: a verify point T feeds rows of at most K + 1 tokens whose lengths
    sum to T (the last row shorter); a draft point drafts one token per row with the draft model; a prefill
    point's drafter first catches up on m tokens. The grid is every count up to DENSE_TOKENS, then powers of 2."""
    from avkit.runtime.engine import Engine
    from avkit.scheduling.profile import DENSE_TOKENS, _token_grid, _verify_layout, profile_costs

    for k in range(0, 16):
        for t in range(1, 300):
            r, q = _verify_layout(t, k)
            assert 1 <= t - q * (r - 1) <= q <= k + 1, (t, k)
    assert _token_grid(100) == list(range(1, DENSE_TOKENS + 1)) + [64, 100] and _token_grid(5) == [1, 2, 3, 4, 5]
    target, draft = tiny_pair[0].model, tiny_pair[1].model
    seen, steps = [], []
    plain_t, plain_d, plain_step = target.forward, draft.forward, Engine.step
    target.forward = lambda tokens, q_lens, *a, **kw: (seen.append(("t", q_lens.tolist(), kw.get("prefill"))),
                                                       plain_t(tokens, q_lens, *a, **kw))[1]
    draft.forward = lambda tokens, q_lens, *a, **kw: (seen.append(("d", q_lens.tolist(), kw.get("prefill"))),
                                                      plain_d(tokens, q_lens, *a, **kw))[1]
    Engine.step = lambda self: (steps.append(len(seen)), plain_step(self))[1]
    try:
        profile_costs(*tiny_pair[:2], ProfileConfig(context_len=8, k=3, max_verify_tokens=9, max_requests=2, repeats=1,
                                                    warmup=0, sampling=SamplingConfig(temperature=0.7)))
    finally:
        del target.forward, draft.forward
        Engine.step = plain_step
    per_step = [seen[a:b] for a, b in zip(steps, steps[1:] + [len(seen)])]
    verify = [s[0][1] for s in per_step[:9]]  # T = 1..9, target-only forwards
    assert verify == [[1], [2], [3], [4], [3, 2], [3, 3], [4, 3], [4, 4], [3, 3, 3]]
    assert all(len(s) == 1 for s in per_step[:9])
    assert per_step[9:11] == [[("t", [1], False)], [("t", [1, 1], False)]]  # target-only n = 1, 2
    assert per_step[11:13] == [[("d", [1], False), ("t", [1], False)],
                               [("d", [1, 1], False), ("t", [1, 1], False)]]  # one draft pass, nothing verified
    assert per_step[13:17] == [[("d", [1], False), ("t", [1], False)]] * 4  # prefill points' base: no catch-up
    catch = per_step[17:21]  # the same step after a catch-up prefill of m tokens into the drafter
    assert [[(w, sum(q)) for w, q, pre in s if pre] for s in catch] == [[("d", m)] for m in (16, 64, 256, 512)]
    assert all(s[-2:] == [("d", [1], False), ("t", [1], False)] for s in catch)


def test_profile_records_its_sampling_settings(tiny_pair):
    table = profile_costs_tiny(tiny_pair, sampling=SamplingConfig(temperature=0.0, top_p=1.0))
    assert table.meta["temperature"] == 0.0 and table.meta["top_p"] == 1.0 and table.meta["timed"] == "engine step"
    with pytest.raises(ConfigError, match="--top-p must be in"):
        ProfileConfig(sampling=SamplingConfig(top_p=0.0))


def profile_costs_tiny(tiny_pair, **kw):
    from avkit.scheduling.profile import profile_costs

    return profile_costs(*tiny_pair[:2], ProfileConfig(context_len=8, k=1, max_verify_tokens=2, max_requests=1,
                                                       repeats=1, **kw))


def test_profile_env_must_be_integer(monkeypatch):
    from avkit.scheduling.cost import context_len_from_env

    monkeypatch.setenv("AVKIT_PROFILE_CONTEXT_LEN", "lots")
    with pytest.raises(ConfigError, match="AVKIT_PROFILE_CONTEXT_LEN"):
        context_len_from_env(8192)


def test_profile_cli_writes_a_cost_table(tiny_pair, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from avkit.cli import app

    root = tiny_pair[2]
    monkeypatch.setenv("AVKIT_PROFILE_CONTEXT_LEN", "16")
    out = tmp_path / "cost.json"
    r = CliRunner().invoke(app, ["profile", "--target", str(root / "t"), "--draft", str(root / "d"), "--out", str(out),
                                 "--max-verify-tokens", "4", "--max-requests", "2", "--repeats", "1", "-k", "1"])
    assert r.exit_code == 0, r.output
    table = CostTable.load(out)
    assert table.verify_tokens == (1, 2, 3, 4) and table.meta["context_len"] == 16
    assert table.meta["dtype"] == "float32"  # auto on CPU
    assert "noise: repeated runs" in r.output and table.meta["noise"]["max_spread"] == 0.0  # one run per point

    r = CliRunner().invoke(app, ["profile", "--target", str(root / "t"), "--draft", "none", "--out", str(out),
                                 "--max-verify-tokens", "2", "--repeats", "1", "-k", "1", "--dtype", "bfloat16"])
    assert r.exit_code == 0, r.output
    assert CostTable.load(out).meta["dtype"] == "bfloat16"
    r = CliRunner().invoke(app, ["profile", "--target", str(root / "t"), "--out", str(out), "--dtype", "fp8"])
    assert str(r.exception) == "--dtype must be one of auto, float32, bfloat16; got fp8"  # a ConfigError: exit 2 from `avkit`


def test_profile_noise_is_per_point_and_names_what_the_isotonic_fit_moved():
    from avkit.cli.profile import noise_line
    from avkit.scheduling.profile import noise_summary

    quiet = noise_summary({"verify_ms": ([1, 2, 4], [[1.0, 1.01, 1.02], [2.0, 2.02, 2.0], [4.0, 4.04, 4.0]])})
    assert not quiet["noisy"] and quiet["moved"] == [] and quiet["points"]["verify_ms"] == [0.0099, 0.005, 0.005]
    assert "warning" not in noise_line(quiet)
    # the curve goes down at T=4 (a spike at T=2): the isotonic fit pools them (4.5 each) and says so
    spiky = noise_summary({"verify_ms": ([1, 2, 4], [[1.0, 1.0], [5.0, 5.0], [4.0, 4.0]])})
    assert spiky["noisy"] and spiky["moved"] == [("verify_ms", 2, -0.1), ("verify_ms", 4, 0.125)]
    assert "warning" in noise_line(spiky) and "verify_ms=4" in noise_line(spiky)
    # repeats of one point spread by 30% (IQR / median) make the table noisy with nothing moved
    wide = noise_summary({"draft_ms": ([1, 2], [[1.0, 1.6, 1.0, 1.6], [2.0, 2.0, 2.0, 2.0]])})
    assert wide["noisy"] and wide["worst"] == "draft_ms=1" and wide["moved"] == []
    assert wide["points"]["draft_ms"] == [round(0.6 / 1.3, 4), 0.0]


def test_profile_reads_a_real_prefix_written_by_the_models_prefill(tiny_pair):
    """write_prefix: slot 0's keys come from the model's own prefill of real tokens and every row reads a copy;
    a seated engine's fed step then verifies the prefix's real continuation with the logits one forward over
    prefix + continuation gives."""
    from avkit.scheduling.profile import prompt_tokens
    from avkit.scheduling.profile import SeatedEngine, write_prefix

    model = tiny_pair[0].model
    ids = prompt_tokens(tiny_pair[0], 24)
    assert len(ids) == 24 and ids == prompt_tokens(tiny_pair[0], 24)  # seeded: the tiny model has no tokenizer
    cache = model.new_cache(3, 32)
    write_prefix(model, cache, ids[:20], 3)
    assert cache.lengths.tolist() == [20, 20, 20] and bool(cache.k[:, 0, :, :20].abs().sum() > 0)
    assert torch.equal(cache.k[:, 2, :, :20], cache.k[:, 0, :, :20])
    seated = SeatedEngine(tiny_pair[0], None, ids, 20, 3, 2, SamplingConfig(temperature=0.0, top_p=1.0))
    seen = []
    plain = model.forward
    model.forward = lambda *a, **kw: (lambda out: (seen.append(out), out)[1])(plain(*a, **kw))
    try:
        for _ in range(2):  # rewound: the same step twice
            rewind, run = seated.step(3, 19, (2, 2, 2))
            rewind()
            run()
    finally:
        del model.forward
    ref = model.new_cache(1, 32)
    whole = model.forward(torch.tensor([ids[:22]]), torch.tensor([22]), torch.tensor([0]), ref, logits="all")
    torch.testing.assert_close(seen[0][1, :3], whole[0, 19:22], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(seen[1], seen[0])


def test_requests_are_priced_beyond_their_tokens_and_older_files_read_as_zero(tmp_path):
    """request_ms(n) adds to every step of n requests whatever its tokens (drafting or not); the HVD unit view
    scales it; a file without the field (older profiles) prices requests at 0."""
    t = _table(request_ms=(0.0, 7.0))
    np.testing.assert_allclose(t.step_cost([1, 8, 8], [0, 0, 3], [4, 4, 32]) - _table().step_cost(
        [1, 8, 8], [0, 0, 3], [4, 4, 32]), [0.0, 7.0, 7.0])
    assert in_forwards(t).request_ms == (0.0, 3.5)
    old = t.to_json()
    del old["request_ms"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert CostTable.load(path).request_ms == () and float(CostTable.load(path).step_cost(8, 0, 4)) == 2.0
    with pytest.raises(ConfigError, match="request must be non-decreasing"):
        _table(request_ms=(1.0, 0.5))


def test_shape_scale_multiplies_exactly_its_shapes(tmp_path):
    """A factor prices only the step shape it names (requests, draft rows (0 without passes), passes, tokens,
    lookups, context band): checked element by element against a loop that builds each key by hand
    (round(2 log2(1 + context / n))); a parallel drafter's k drafts are its one pass; the factor survives JSON
    and the HVD unit view."""
    ctx = 4 * 100  # 100 tokens per request at n = 4: band round(2 log2 101) = 13
    t = _table(context_len=100, kv_ms_per_token=0.01, shape_scale=((4, 4, 3, 16, 0, 13, 1.2), (4, 0, 0, 4, 0, 13, 0.9)))
    n, k, tok, c = np.array([4, 4, 4, 4, 1]), np.array([3, 3, 0, 2, 0]), np.array([16, 16, 4, 16, 1]), \
        np.array([ctx, 9 * ctx, ctx, ctx, 100])  # [5] each
    plain = replace(t, shape_scale=()).step_cost(n, k, tok, c)
    factors = {tuple(e[:6]): e[6] for e in t.shape_scale}
    want = [plain[i] * factors.get((n[i], n[i] if k[i] else 0, k[i], tok[i], 0, round(2 * math.log2(1 + c[i] / n[i]))), 1)
            for i in range(5)]
    np.testing.assert_allclose(t.step_cost(n, k, tok, c), want)
    assert [w / p for w, p in zip(want, plain)] == pytest.approx([1.2, 1.0, 0.9, 1.0, 1.0])
    assert shape_keys(4, 3, 16, ctx, 4, 0).tolist() == [4, 4, 3, 16, 0, 13]
    par = _table(drafter="parallel", shape_scale=((1, 1, 1, 6, 0, 0, 2.0),))
    assert float(par.step_cost(1, 5, 6, 0)) == 2.0 * float(replace(par, shape_scale=()).step_cost(1, 5, 6, 0))
    back = CostTable.load(t.save(tmp_path / "scaled.json"))
    np.testing.assert_allclose(back.step_cost(n, k, tok, c), want)
    np.testing.assert_allclose(in_forwards(t).step_cost(n, k, tok, c), np.asarray(want) / 2.0)
