"""Cache-drafted rows (HVD's hybrid drafter) are scored and refit by their own estimator, not the
draft model's: the policy's confidences against a numpy logistic oracle, the labels each estimator
learns from against a brute-force split, `avkit fit --drafter suffix` against a fit of the cache rows
alone, the coefficients file's drafter check, and the engine (greedy equality with target-only, the
trace's confidences by drafter, chi-square at T = 1 against HF transformers)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from avkit.config import AdaptiveConfig, EngineConfig, EstimatorConfig, FitConfig, SamplingConfig, SyntheticConfig
from avkit.drafters.draft_model import DraftModelDrafter
from avkit.errors import ConfigError
from avkit.estimators.online_logistic import OnlineLogistic
from avkit.hvd.hybrid_drafter import HybridDrafter
from avkit.kernels.dispatch import select_kernels
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.adaptive import make_adaptive
from avkit.step_types import DraftBatch, Load, VerifyOutcome

K = 4
MODEL = {"slope": 0.8, "intercepts": [1.5, 1.0, 0.5, 0.0]}
CACHE = {"slope": 0.1, "intercepts": [-3.0, -3.0, -3.0, -3.0]}  # doubtful cache drafts: trimmed hard


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _coefficients_file(path, coef: dict, drafter: str | None) -> str:
    doc = {"schema_version": 1, "feature": "logit_qmax", "num_positions": K, **coef}
    if drafter is not None:
        doc["trained_on"] = {"drafter": drafter}
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture()
def files(tmp_path):
    return (_coefficients_file(tmp_path / "model.json", MODEL, None),
            _coefficients_file(tmp_path / "cache.json", CACHE, "suffix"))


def _policy(files, refit_interval: int = 1000):
    model_file, cache_file = files
    return make_adaptive("roofline:H200:8b", "online_logistic", model_file, k=K,
                         adaptive=AdaptiveConfig(cache_coefficients=cache_file),
                         config=EstimatorConfig(refit_interval=refit_interval))


def _batch(b: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(b, K, generator=g) * 2  # [B, K] logit_qmax
    cache = torch.arange(b) % 2 == 1  # [B] odd rows drafted by the cache
    return DraftBatch({"logit_qmax": f}, torch.full((b,), K), cache_rows=cache), f, cache


def _logistic(coef: dict, f: torch.Tensor) -> np.ndarray:
    return _sigmoid(coef["slope"] * f.double().numpy() + np.asarray(coef["intercepts"])[None, :])


def test_cache_rows_are_scored_by_the_cache_estimator(files):
    policy = _policy(files)
    batch, f, cache = _batch()
    conf = policy.confidences(batch).double().numpy()  # [B, K]
    want = np.where(cache.numpy()[:, None], _logistic(CACHE, f), _logistic(MODEL, f))
    np.testing.assert_allclose(conf, want, rtol=1e-5)
    # the same features, scored by the other drafter's estimator, give other confidences
    swapped = dataclasses.replace(batch, cache_rows=~cache)
    assert np.abs(policy.confidences(swapped).double().numpy() - conf).min() > 1e-3
    # sizing (position-0 features at every position) follows each row's estimator too
    first = policy.confidences(batch, K).double().numpy()
    f0 = f[:, :1].expand(-1, K)
    np.testing.assert_allclose(first, np.where(cache.numpy()[:, None], _logistic(CACHE, f0), _logistic(MODEL, f0)),
                               rtol=1e-5)


def test_without_a_file_the_cache_estimator_starts_from_the_reference_constants(files):
    policy = make_adaptive("roofline:H200:8b", "online_logistic", files[0], k=K)
    batch, f, cache = _batch()
    conf = policy.confidences(batch).double().numpy()
    ref = EstimatorConfig()
    fresh = {"slope": ref.init_slope, "intercepts": [ref.init_intercept] * K}
    np.testing.assert_allclose(conf[cache.numpy()], _logistic(fresh, f)[cache.numpy()], rtol=1e-5)
    np.testing.assert_allclose(conf[~cache.numpy()], _logistic(MODEL, f)[~cache.numpy()], rtol=1e-5)


@pytest.mark.parametrize("kernels", [False, True], ids=["host-round", "device-round"])
def test_each_estimator_learns_from_its_own_rows_only(files, kernels):
    """refit every step; the oracle: two estimators fed the brute-force split of the observed slots."""
    policy = _policy(files, refit_interval=1)
    if kernels:
        policy.use_kernels(select_kernels(torch.device("cpu"), "torch"))
    cfg = EstimatorConfig(refit_interval=1)
    oracle = {"model": OnlineLogistic(K, cfg), "cache": OnlineLogistic(K, cfg)}
    oracle["model"].load_state_dict(dict(MODEL, num_positions=K))
    oracle["cache"].load_state_dict(dict(CACHE, num_positions=K))
    load = Load(6, 6, 6)
    for step in range(5):
        batch, f, cache = _batch(seed=step)
        plan = policy.num_verify(batch, load)
        g = torch.Generator().manual_seed(100 + step)
        accepted = torch.minimum(torch.randint(0, K + 1, (6,), generator=g), plan.num_verify)
        pred = plan.confidences.double().numpy()  # [B, K] the predictions made when drafting
        for who, rows in (("model", ~cache), ("cache", cache)):
            feats, poss, preds, labels = [], [], [], []
            for r in np.flatnonzero(rows.numpy()):  # brute force over slots
                for j in range(K):
                    if j < int(plan.num_verify[r]) and j <= int(accepted[r]):
                        feats.append(float(f[r, j]))
                        poss.append(j)
                        preds.append(pred[r, j])
                        labels.append(float(j < int(accepted[r])))
            oracle[who].update(np.array(feats), np.array(poss, dtype=np.int64), np.array(preds), np.array(labels))
        policy.observe(VerifyOutcome(batch.features, plan.confidences, plan.num_verify, accepted, cache))
        for who, est in (("model", policy.estimator), ("cache", policy.cache_estimator)):
            got, want = est.state_dict(), oracle[who].state_dict()
            np.testing.assert_allclose(got["slope"], want["slope"], rtol=1e-5, atol=1e-7, err_msg=f"{who} {step}")
            np.testing.assert_allclose(got["intercepts"], want["intercepts"], rtol=1e-5, atol=1e-7)
    assert policy.refits == policy.cache_refits == 5
    assert len(policy.cache_trajectory) == 5


def test_coefficients_file_must_be_fitted_on_the_rows_it_scores(files, tmp_path):
    model_file, cache_file = files
    with pytest.raises(ConfigError, match=r"trained_on.drafter.*'suffix'.*avkit fit --drafter suffix"):
        make_adaptive("roofline:H200:8b", "online_logistic", model_file, k=K,
                      adaptive=AdaptiveConfig(cache_coefficients=model_file))
    with pytest.raises(ConfigError, match=r"trained_on.drafter.*must be 'model'"):
        make_adaptive("roofline:H200:8b", "online_logistic", cache_file, k=K)
    bad = _coefficients_file(tmp_path / "bad.json", MODEL, "eagle")
    with pytest.raises(ConfigError, match=r"trained_on.drafter.*must be one of"):
        make_adaptive("roofline:H200:8b", "online_logistic", bad, k=K)


def test_fit_drafter_suffix_fits_the_cache_rows_alone(tmp_path):
    """`avkit fit --drafter suffix` on a mixed trace = the same fit on a trace of the cache rows only."""
    from avkit.fit import run_fit
    from avkit.trace.synthetic import synthetic_trace

    arrow = synthetic_trace(SyntheticConfig(num_slots=20_000, k=K, seed=3, intercepts=(1.0, 0.5, 0.0, -0.5)))
    table = pl.from_arrow(arrow)
    req = table["request_id"].cast(pl.String).str.extract(r"(\d+)$").cast(pl.Int64)
    mixed = table.with_columns(pl.when(req % 3 == 0).then(pl.lit("suffix")).otherwise(pl.lit("model"))
                               .alias("drafter"))
    alone = mixed.filter(pl.col("drafter") == "suffix").with_columns(pl.lit("model").alias("drafter"))
    paths = [tmp_path / "mixed.parquet", tmp_path / "alone.parquet"]
    for df, path in zip((mixed, alone), paths):
        pq.write_table(df.to_arrow().replace_schema_metadata(arrow.schema.metadata), path)
    suffix = run_fit([paths[0]], FitConfig(mode="batch", drafter="suffix"))
    oracle = run_fit([paths[1]], FitConfig(mode="batch"))
    model = run_fit([paths[0]], FitConfig(mode="batch"))
    a, b = suffix.coefficients, oracle.coefficients
    assert a["trained_on"]["drafter"] == "suffix" and b["trained_on"]["drafter"] == "model"
    assert a["trained_on"]["observed"] == b["trained_on"]["observed"] > 0
    np.testing.assert_allclose(a["slope"], b["slope"], rtol=1e-9)
    np.testing.assert_allclose(a["intercepts"], b["intercepts"], rtol=1e-9)
    assert model.coefficients["trained_on"]["observed"] + a["trained_on"]["observed"] == oracle_total(mixed)
    with pytest.raises(ConfigError, match="--drafter suffix"):
        FitConfig(mode="batch", engine="streaming", drafter="suffix")


def oracle_total(df: pl.DataFrame) -> int:
    return int(df["accepted"].is_not_null().sum())


def _engine(pair, files, max_batch: int, sink=None):
    """Hybrid drafter (every cache draft routed to verification) + the adaptive policy of `files`, on
    the tests' tiny pair (conftest.py) with no EOS."""
    target = dataclasses.replace(pair[2], tokenizer=type("T", (), {"eos_token_ids": set()})())
    draft = pair[3]
    cfg = EngineConfig(k=K, concurrency=max_batch, max_len=64)
    hybrid = HybridDrafter(DraftModelDrafter(draft, cfg.concurrency, cfg.max_len), None, tau=0.0, k=K, rule="cache")
    return Engine(target, None, cfg, policy=_policy(files), sink=sink, drafter=hybrid)


def test_engine_scores_cache_rows_by_their_estimator_and_stays_greedy_exact(pair, files):
    reqs = [Request(f"r{i}", [5 + i, 6, 7, 8, 9] * 4, SamplingConfig(temperature=0.0, max_new_tokens=16))
            for i in range(3)]
    target = dataclasses.replace(pair[2], tokenizer=type("T", (), {"eos_token_ids": set()})())
    ref = Engine(target, None, EngineConfig(k=0, concurrency=2, max_len=64)).generate(reqs)
    sink = MemorySink()
    out = _engine(pair, files, 2, sink).generate(reqs)
    for a, b in zip(ref, out):
        assert b.output_ids == a.output_ids, a.request_id
    cols = sink.columns()
    kinds = np.asarray(cols["drafter"])
    assert set(kinds.tolist()) == {"suffix", "model"}
    f = torch.as_tensor(np.ma.getdata(cols["logit_qmax"]).astype(np.float64))
    pos = np.asarray(cols["position"])
    conf = np.ma.getdata(cols["confidence"]).astype(np.float64)
    for who, coef in (("suffix", CACHE), ("model", MODEL)):
        rows = kinds == who
        want = _sigmoid(coef["slope"] * f.numpy()[rows] + np.asarray(coef["intercepts"])[pos[rows]])
        np.testing.assert_allclose(conf[rows], want, rtol=1e-4, err_msg=who)


def test_engine_with_cache_estimator_is_lossless_at_t1(pair, files):
    """First two tokens of 1,500 seeded requests (a repetitive prompt: cache rows every step, trimmed by
    the cache's own doubtful estimator) against HF transformers' distribution of the target."""
    from test_lossless import assert_first_two_tokens_follow_hf

    prompt, top_p, n = [40, 41, 42, 40, 41, 42, 40, 41], 0.9, 1500
    sampling = SamplingConfig(temperature=1.0, top_p=top_p, max_new_tokens=3, seed=77)
    sink = MemorySink()
    gens = _engine(pair, files, 100, sink).generate([Request(f"s{i}", prompt, sampling) for i in range(n)])
    cols = sink.columns()
    kinds = np.asarray(cols["drafter"])
    verified = np.asarray(cols["verified"]).astype(bool)
    assert verified[kinds == "suffix"].any() and (~verified[kinds == "suffix"]).any()  # trimmed, not all
    assert_first_two_tokens_follow_hf(pair[0], prompt, top_p, [g.output_ids[:2] for g in gens])


def test_serve_refuses_cache_coefficients_without_the_hybrid_drafter(files):
    from avkit.config import ModelsConfig, ServeConfig
    from avkit.serve.server import warm_start

    config = ServeConfig(engine=EngineConfig(k=K), adaptive=AdaptiveConfig(cache_coefficients=files[1]))
    with pytest.raises(ConfigError, match="--cache-coefficients .*--drafter hybrid"):
        warm_start(config)
    hybrid = dataclasses.replace(config, models=ModelsConfig(drafter="hybrid"))
    warm_start(hybrid)  # the file is fitted on cache rows: accepted
    with pytest.raises(ConfigError, match="trained_on.drafter"):
        warm_start(dataclasses.replace(hybrid, adaptive=AdaptiveConfig(cache_coefficients=files[0])))


def test_serve_snapshots_the_cache_estimator_and_a_restart_restores_it(pair, tmp_path):
    """A real round trip: a hybrid server refits its cache estimator on repetitive prompts, closes (the
    shutdown snapshot writes both files), and a server started on the same --snapshot resumes both."""
    import httpx
    from serve_support import running_server, serve_config

    from avkit.estimators.coefficients import load_coefficients
    from avkit.serve.server import build_state
    from avkit.serve.side_writes import cache_snapshot_of

    prompt = "x = 1\ny = 2\n" * 6
    kw = {"drafter": "hybrid", "refit_interval": 2, "draft_gate": False}
    with running_server(pair, tmp_path, **kw) as (url, state):
        for _ in range(3):  # later requests also draft from the global cache of the earlier responses
            r = httpx.post(url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0})
            assert r.status_code == 200
        policy = state.make_engine().policy
        assert policy.cache_refits > 0, "no cache estimator refit: the test saw no cache drafts"
    live_model, live_cache = policy.estimator.state_dict(), policy.cache_estimator.state_dict()
    snap = tmp_path / "snap.json"
    doc = load_coefficients(cache_snapshot_of(snap), k=4, drafter="suffix")  # the file --cache-coefficients takes
    assert doc["refits"] == policy.cache_refits and doc["trained_on"]["drafter"] == "suffix"
    assert live_cache["intercepts"] != live_model["intercepts"]  # two estimators, not one file twice

    resumed = build_state(serve_config(pair, tmp_path, **kw), target=pair[2], draft=pair[3])
    again = resumed.make_engine().policy
    assert resumed.config.adaptive.cache_coefficients == str(cache_snapshot_of(snap))
    for live, back in ((live_model, again.estimator.state_dict()), (live_cache, again.cache_estimator.state_dict())):
        assert back["slope"] == live["slope"] and back["intercepts"] == live["intercepts"]
        assert back["rounds"] == live["rounds"] and back["observations"] == live["observations"]
    # --no-resume: neither file; the cache estimator is made fresh when the first cache rows appear
    fresh = build_state(serve_config(pair, tmp_path, resume=False, **kw), target=pair[2], draft=pair[3])
    assert fresh.make_engine().policy.cache_estimator is None
