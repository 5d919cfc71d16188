"""Live HVD with the joint router (avkit/hvd/joint.py): the payoff survival file round trip, the
plan against a brute-force oracle, losslessness through the engine (greedy equality, chi-square at
T = 1 against HF transformers), a served request over HTTP, and the shared cache's memory bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import avkit.models
from avkit.config import EngineConfig, HvdCostConfig, HvdReplayConfig, PayoffConfig, SamplingConfig, SuffixCacheConfig
from avkit.drafters.draft_model import DraftModelDrafter
from avkit.hvd.cost import cost_from_json, linear_table
from avkit.hvd.fit import fit_hvd_generations
from avkit.hvd.hybrid_drafter import HybridDrafter
from avkit.hvd.joint import JointRouter
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.hvd.suffix_cache import NODE_BYTES, SuffixCache, SuffixTrie
from avkit.hvd.replay import synthetic_generations
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink

K = 4


@pytest.fixture(scope="module")
def survival_file(tmp_path_factory):
    """payoff_survival.pt written by the real `avkit hvd` pipeline on synthetic generations (K = 4)."""
    out = tmp_path_factory.mktemp("hvd_fit")
    gens = synthetic_generations(num_requests=15, seed=2, vocab=300, prompt_len=40, output_len=60)
    fit_hvd_generations(gens, out, replay_config=HvdReplayConfig(k=K), payoff_config=PayoffConfig(epochs=3),
                        routers=("survival",), ablation=False)
    return out / "payoff_survival.pt"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hvd_live_models")
    target_dir = write_tiny_model(root / "t", vocab=300, seed=0, init_std=0.3)
    target = avkit.models.load(target_dir)
    target = dataclasses.replace(target, tokenizer=type("T", (), {"eos_token_ids": set()})())
    return target_dir, target, avkit.models.load(write_tiny_model(root / "d", vocab=300, seed=1, init_std=0.3))


def test_survival_file_loads_the_joint_router(survival_file):
    live = HybridDrafter.from_file(None, survival_file, vocab_size=300)
    assert live.plans and live.joint is not None and live.k == K
    assert live.joint.model_surv.shape == (len(live.joint.hit_bins) + 1, K)
    assert live.joint.cost == linear_table()  # the replay's cost model travels with the weights
    surv = live.joint.model_surv
    assert (np.diff(surv, axis=1) <= 1e-12).all() and (surv >= 0).all() and (surv <= 1).all()


def _brute_force(cs: np.ndarray, ms: np.ndarray, c_d: float, k: int) -> tuple[float, np.ndarray]:
    """Best E/cost over both options and every budget b by enumeration (no plan.py), under the linear model
    with draft step c_d and HvdCostConfig's other prices (a lookup per request): (rate, [n] prefixes)."""
    c_v, c_cache = HvdCostConfig.verify_token_cost, HvdCostConfig.cache_cost
    n = len(cs)
    best = (-1.0, None)
    for model_runs in (True, False):
        use = (cs.sum(1) >= ms.sum(1)) if model_runs else np.ones(n, dtype=bool)
        if model_runs and use.all():
            continue
        s = np.where(use[:, None], cs, ms)
        fixed = (c_d * k if model_runs else 0.0) + n * c_cache
        slots = sorted(((s[r, j], r, j) for r in range(n) for j in range(k) if s[r, j] > 0),
                       key=lambda t: (-t[0], t[1], t[2]))
        for b in range(len(slots) + 1):
            rate = (n + sum(v for v, _, _ in slots[:b])) / (fixed + 1 + c_v * (n + b))
            if rate > best[0] + 1e-12:
                pref = np.zeros(n, dtype=np.int64)
                for _, r, _ in slots[:b]:
                    pref[r] += 1
                best = (rate, pref)
    return best


def test_joint_plan_equals_brute_force(survival_file):
    live = HybridDrafter.from_file(None, survival_file, vocab_size=300)
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(1, 7))
        cs = np.sort(rng.random((n, K)), 1)[:, ::-1] * (rng.random((n, 1)) < 0.7)
        ms = np.sort(rng.random((n, K)), 1)[:, ::-1]
        c_d = float(rng.choice([0.05, 0.33]))
        cost = cost_from_json(dict(draft_step_cost=c_d))
        from avkit.hvd.joint import joint_step

        use, pref = joint_step(cs, ms, cost, K)
        s = np.where(use[:, None], cs, ms)
        fixed = (c_d * K if (~use).any() else 0.0) + n * HvdCostConfig.cache_cost
        got = (n + sum(s[r, :pref[r]].sum() for r in range(n))) / (fixed + 1 + HvdCostConfig.verify_token_cost
                                                                   * (n + pref.sum()))
        want, want_pref = _brute_force(cs, ms, c_d, K)
        assert got == pytest.approx(want, rel=1e-9), trial
        assert pref.sum() == want_pref.sum(), trial
    assert live.joint is not None


def _option_plans(cs, ms, cost, k, catch=None):
    """Per option (model runs for every row preferring it / for those of them needing no catch-up / not), by
    enumeration: (use [n], best-ratio prefixes [n], E, cost); `catch` [n] each row's catch-up cost."""
    n, out = len(cs), []
    catch = np.zeros(n) if catch is None else catch
    wants = cs.sum(1) < ms.sum(1)
    for model in (wants, wants & (catch == 0), np.zeros(n, dtype=bool)):
        use = ~model
        if (model.any() or model is not wants) and any(np.array_equal(use, o[0]) for o in out):
            continue  # the same option twice
        if model is wants and not model.any():
            continue  # nobody wants the model
        s = np.where(use[:, None], cs, ms)
        fixed = (k * float(cost.draft_pass_cost(model.sum())) + float(catch[model].sum()) if model.any() else 0.0) \
            + n * cost.lookup_ms  # every row looked the cache up
        slots = sorted(((s[r, j], r, j) for r in range(n) for j in range(k) if s[r, j] > 0),
                       key=lambda t: (-t[0], t[1], t[2]))
        plans = [((n + sum(v for v, _, _ in slots[:b])), fixed + float(cost.verify_cost(n + b)), b) for b in
                 range(len(slots) + 1)]
        e, c, b = max(plans, key=lambda t: (t[0] / t[1] - 1e-12 * t[2]))  # ties: the smaller b
        pref = np.zeros(n, dtype=np.int64)
        for _, r, _ in slots[:b]:
            pref[r] += 1
        out.append((use, pref, e, c))
    return out


CATCH = {"verify_points": ((1, 1.0), (6, 1.5), (7, 2.1), (32, 7.0)), "draft_points": ((1, 0.5), (16, 1.4)),
         "prefill_points": ((16, 1.0), (256, 15.0))}
CATCH_COST = cost_from_json(CATCH)


def test_catch_up_is_the_draft_models_prefill_of_what_it_missed():
    """lag <= 2: free (the first pass feeds it); else a forward over lag - 1 tokens: below the prefill grid a
    draft step over that many rows, then the prefill curve (last slope beyond); no curve: free."""
    c = CATCH_COST
    lags = np.array([0, 1, 2, 3, 10, 16, 17, 100, 257, 400])
    want = [0, 0, 0, c.draft_pass_cost(2), c.draft_pass_cost(9), c.draft_pass_cost(15), 1.0, 1.0 + 14 * 83 / 240, 15.0, 15.0 + 14 * 143 / 240]
    assert np.allclose(c.catch_up_cost(lags), want)
    assert not linear_table().catch_up_cost(lags).any()


def test_joint_step_prices_the_catch_up_and_may_leave_lagging_rows_to_the_cache():
    """With lags the model option pays each model row's catch-up; a third option runs the model only for rows
    it already follows. The choice equals enumeration of the options, and every option wins somewhere."""
    from avkit.hvd.joint import RunningRate, joint_step

    cost = cost_from_json({**CATCH, "draft_points": ((1, 0.1), (16, 0.3))})  # a cheap drafter: the model pays
    rng = np.random.default_rng(3)
    won = set()
    for trial in range(80):
        n = int(rng.integers(1, 6))
        cs = np.sort(rng.random((n, K)), 1)[:, ::-1] * (rng.random((n, 1)) < 0.5)
        ms = np.sort(rng.random((n, K)), 1)[:, ::-1] ** 0.3
        lag = np.where(rng.random(n) < 0.5, rng.integers(3, 300, n), rng.integers(1, 3, n))
        catch = cost.catch_up_cost(lag)
        rate = RunningRate() if trial % 2 else None
        if rate is not None:
            rate.update(n, float(rng.uniform(0.5, 2.0)) * n, 1.0)
        lam = None if rate is None else rate.value(n)
        use, pref = joint_step(cs, ms, cost, K, rate, lag)
        opts = _option_plans(cs, ms, cost, K, catch)
        want = max(opts, key=lambda o: o[2] / o[3] if lam is None else o[2] - lam * o[3])
        assert np.array_equal(use, want[0]) and np.array_equal(pref, want[1]), trial
        wants = cs.sum(1) < ms.sum(1)
        won.add("cache" if use.all() else ("all" if np.array_equal(~use, wants) else "followed"))
    assert won == {"cache", "followed", "all"}


def test_the_batched_replay_pays_one_prompt_catch_up_then_follows():
    """One request, the model always right and the cache empty: the first model step prefills the prompt
    (priced once), later steps lag by at most 2 tokens (free). Spent = catch_up(prompt) + steps x step cost."""
    import polars as pl

    from avkit.hvd.joint import simulate_batched
    from avkit.hvd.path import full_route

    n, prompt = 40, 120
    table = pl.DataFrame({"request_id": ["r"] * n, "cache_acc": [0] * n, "model_acc": [K] * n, "draft_len": [0] * n,
                          "log_prompt_len": [float(np.log1p(prompt))] * n})
    cheap = cost_from_json({**CATCH, "prefill_points": ((16, 0.1), (256, 0.5))})
    surv = (np.zeros((n, K)), np.ones((n, K)))
    got = simulate_batched(table, full_route(table, np.ones(n, dtype=bool)), cheap, K, 1, surv)
    steps = -(-n // (K + 1))
    step = K * float(cheap.draft_pass_cost(1)) + float(cheap.verify_cost(1 + K)) + cheap.lookup_ms
    assert got["steps"] == steps
    assert n / got["throughput"] == pytest.approx(float(cheap.catch_up_cost(prompt)) + steps * step)
    free = cost_from_json({**CATCH, "prefill_points": ()})
    assert n / simulate_batched(table, full_route(table, np.ones(n, dtype=bool)), free, K, 1, surv)["throughput"] \
        == pytest.approx(steps * step)


def test_joint_step_against_the_long_run_rate():
    """With a running rate lambda the option with the larger E - lambda cost wins (Dinkelbach), each
    option keeping its best-ratio budget; the rate then takes the chosen plan's E and cost."""
    from avkit.hvd.joint import RunningRate, joint_step

    rng = np.random.default_rng(1)
    seen = set()
    for trial in range(60):
        n = int(rng.integers(1, 6))
        cs = np.sort(rng.random((n, K)), 1)[:, ::-1] * (rng.random((n, 1)) < 0.6)
        ms = np.sort(rng.random((n, K)), 1)[:, ::-1]
        cost = cost_from_json(dict(verify_points=((1, 1.0), (4, 1.1), (8, 2.0), (32, 7.0)),
                                  draft_points=((1, float(rng.choice([0.1, 0.5]))), (8, 1.4))))
        rate = RunningRate()
        rate.update(n, float(rng.uniform(0.5, 3.0)) * n, 1.0)
        rate.update(n + 1, 100.0, 1.0)  # another batch size's rate plays no part
        lam = rate.value(n)
        use, pref = joint_step(cs, ms, cost, K, rate)
        opts = _option_plans(cs, ms, cost, K)
        want = max(opts, key=lambda o: o[2] - lam * o[3])
        assert np.array_equal(use, want[0]) and np.array_equal(pref, want[1]), trial
        assert rate.sums[n] == pytest.approx((0.95 * lam + want[2], 0.95 + want[3]))
        assert rate.sums[n + 1] == (100.0, 1.0)
        seen.add(bool(use.all()))
    assert seen == {True, False}  # both options won somewhere
    fresh = RunningRate()  # no step at this size yet: the myopic E / cost
    use, pref = joint_step(cs, ms, cost, K, fresh)
    want = max(_option_plans(cs, ms, cost, K), key=lambda o: o[2] / o[3])
    assert np.array_equal(use, want[0]) and np.array_equal(pref, want[1])


def _engine(tiny, survival_file, sampling_batch=2, model_rate=0.6, cache_rate=0.8, cost=None):
    """The engine with the joint router on pinned curves: the survival head's last layer set to a
    constant hazard (cache S_j = cache_rate^j up to the draft's length), model S_j = model_rate^j, and an
    EAGLE-like drafting cost (0.05 target forwards per step). Long cache drafts then beat the model and
    one-token ones lose to it, so both drafters win rows on the tiny random pair (whose outputs are
    far from the synthetic training data the fitted head saw)."""
    _, target, draft = tiny
    cfg = EngineConfig(k=K, concurrency=sampling_batch, max_len=96)
    payoff, extra = PayoffMLP.load(survival_file)
    last = payoff.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(float(np.log(cache_rate / (1 - cache_rate))))
    bins = np.asarray(extra["hit_bins"])
    joint = JointRouter(payoff, np.tile(model_rate ** np.arange(1, K + 1), (len(bins) + 1, 1)), bins,
                        cost or cost_from_json(dict(draft_step_cost=0.05)))
    hybrid = HybridDrafter(DraftModelDrafter(draft, cfg.concurrency, cfg.max_len), None, 0.0, joint=joint)
    sink = MemorySink()
    return Engine(target, None, cfg, sink=sink, drafter=hybrid), sink


def test_engine_greedy_with_joint_router_equals_target_only(tiny, survival_file):
    _, target, _ = tiny
    reqs = [Request(f"r{i}", [5 + i, 6, 7, 8, 9] * 4, SamplingConfig(temperature=0.0, max_new_tokens=24))
            for i in range(4)]
    ref = Engine(target, None, EngineConfig(k=0, concurrency=2, max_len=96)).generate(reqs)
    engine, sink = _engine(tiny, survival_file)
    out = engine.generate(reqs)
    for a, b in zip(ref, out):
        assert b.output_ids == a.output_ids, a.request_id
    cols = sink.columns()
    kinds = set(np.asarray(cols["drafter"]).tolist())
    assert "suffix" in kinds  # the cache won slots; the shared global tree saw every finished response
    assert engine.drafter.cache.memory()["global_responses"] == len(reqs)


def test_engine_prices_the_draft_models_catch_up_live(tiny, survival_file):
    """The live router passes each row's draft-model lag: with a prefill curve that makes a catch-up dearer
    than any draft can repay, the model (which has followed no request yet) never runs; without a curve it
    does. Output equals target-only either way."""
    _, target, _ = tiny
    reqs = [Request(f"r{i}", [5 + i, 6, 7, 8, 9] * 4, SamplingConfig(temperature=0.0, max_new_tokens=24))
            for i in range(4)]
    ref = Engine(target, None, EngineConfig(k=0, concurrency=2, max_len=96)).generate(reqs)
    runs = {}
    for name, prefill in (("dear", ((16, 500.0), (64, 2000.0))), ("free", ())):
        cost = cost_from_json(dict(draft_step_cost=0.05, draft_points=((1, 0.05), (16, 0.1)), prefill_points=prefill))
        engine, sink = _engine(tiny, survival_file, cost=cost)
        assert [g.output_ids for g in engine.generate(reqs)] == [g.output_ids for g in ref]
        runs[name] = set(np.asarray(sink.columns()["drafter"]).tolist())
    assert "model" not in runs["dear"] and "model" in runs["free"]


def test_engine_with_joint_router_is_lossless_at_t1(tiny, survival_file):
    """First two tokens over 2,000 seeded requests (one repetitive prompt, so cache drafts compete with
    model drafts every step) against HF transformers' distribution of the target."""
    from test_lossless import assert_first_two_tokens_follow_hf

    target_dir = tiny[0]
    prompt, top_p, N = [40, 41, 42, 40, 41, 42, 40, 41], 0.9, 2000
    sampling = SamplingConfig(temperature=1.0, top_p=top_p, max_new_tokens=4, seed=321)
    engine, sink = _engine(tiny, survival_file, sampling_batch=100, model_rate=0.7)  # short cache drafts lose
    gens = engine.generate([Request(f"s{i}", prompt, sampling) for i in range(N)])
    out = torch.tensor([g.output_ids[:2] for g in gens])  # [N, 2]
    cols = sink.columns()
    verified = np.asarray(cols["verified"]).astype(bool)
    kinds = np.asarray(cols["drafter"])
    assert verified[kinds == "suffix"].any()  # cache drafts won slots (the greedy test sees model rows too)

    assert_first_two_tokens_follow_hf(target_dir, prompt, top_p, out)


def test_joint_proposal_follows_the_input_device(survival_file):
    """Every tensor of a joint-routed proposal is made on the inputs' device (the log checks each
    factory call). The routing decision itself (payoff MLP + plan of host survivals) runs on the host
    by design and hands back numpy, so it is left out of the log."""
    import types

    from test_hybrid_drafter import _DeviceLog, _inp

    live = HybridDrafter.from_file(None, survival_file, vocab_size=300,
                                   cache_config=SuffixCacheConfig(min_token_prob=0.0))
    seq = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    inp = _inp([seq, [7, 8, 9], seq[:9]], k=K)
    host_decide, decided = live.joint.decide, []

    def decide(cols, wanted, lag=None):  # outside the log: numpy in, numpy out
        with torch.overrides._pop_mode_temporarily():
            decided.append(host_decide(cols, wanted, lag))
        return decided[-1]

    live.joint = types.SimpleNamespace(decide=decide)
    with _DeviceLog() as log:
        prop = live.propose(inp)
    assert decided and all(isinstance(a, np.ndarray) for a in decided[0])
    assert log.calls and all(str(dev) == str(inp.num_draft.device) for _, dev in log.calls), log.calls
    assert prop.num_drafted.device == inp.num_draft.device
    assert int(prop.num_drafted[1]) == 0  # no cache draft and no model drafter: nothing proposed


def _fresh_nodes(seqs: list[list[int]], depth: int) -> int:
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
    return trie.num_nodes


def test_global_tree_stays_within_its_token_budget():
    """Many requests through one shared cache: the global tree never holds more than its token budget,
    holds exactly the newest responses that fit (node count equals a fresh build of them), and its
    byte estimate tracks an exact sys.getsizeof walk."""
    cfg = SuffixCacheConfig(max_depth=8, max_cached_requests=1000, max_cached_tokens=600)
    cache = SuffixCache(cfg)
    rng = np.random.default_rng(5)
    kept: list[list[int]] = []
    for r in range(150):
        prompt = rng.integers(0, 50, 20).tolist()
        out = rng.integers(0, 50, int(rng.integers(1, 120))).tolist()
        cache.start_request(f"r{r}", prompt)
        cache.append(f"r{r}", out)
        cache.finish_request(f"r{r}")
        kept.append(out)
        while sum(map(len, kept)) > cfg.max_cached_tokens:
            kept.pop(0)
        m = cache.memory()
        assert m["global_tokens"] == sum(map(len, kept)) <= cfg.max_cached_tokens
    assert cache.global_trie.num_nodes == _fresh_nodes(kept, 8)
    assert cache.evicted == 150 - len(kept)
    exact = cache.global_trie.deep_bytes()
    assert 0.6 < cache.memory()["global_bytes"] / exact < 1.6, (exact, cache.global_trie.num_nodes * NODE_BYTES)
    long = SuffixCache(SuffixCacheConfig(max_cached_tokens=50))
    long.start_request("x", [1])
    long.append("x", list(range(200)))
    long.finish_request("x")
    assert long.memory()["global_tokens"] == 50  # a response longer than the budget keeps its tail


def test_served_request_with_joint_router(pair, tmp_path, survival_file):
    """`avkit serve --drafter hybrid --payoff payoff_survival.pt`: greedy completions over HTTP equal
    target-only decoding, and /metrics reports the shared cache's memory."""
    import openai

    from avkit.serve.server import build_state, serve_in_thread
    from serve_support import metrics, serve_config
    from test_serve import _greedy_reference

    tok = pair[2].tokenizer
    prompt = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\n"
    ref = _greedy_reference(pair[2], tok.encode(prompt), 24)
    cfg = serve_config(pair, tmp_path, drafter="hybrid", policy="full")
    cfg = dataclasses.replace(cfg, models=dataclasses.replace(cfg.models, payoff=str(survival_file)))
    state = build_state(cfg, target=pair[2], draft=pair[3])
    assert state.make_engine().drafter.plans  # the joint router, from the survival file
    with serve_in_thread(state) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(3):
            out = c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
            assert out.choices[0].text == tok.decode(ref.output_ids, skip_special_tokens=True)
        m = metrics(url)
    assert m[("avkit_suffix_cache_responses", ())] == 3
    assert m[("avkit_suffix_cache_tokens", (("tree", "global"),))] == 3 * len(ref.output_ids)
    assert m[("avkit_suffix_cache_bytes_per_token", ())] > 0


def test_verdict_agrees_with_the_path_simulator():
    """The per-dataset verdict's routers are `evaluate`'s numbers (one accounting), and its flags follow from
    its own numbers."""
    from avkit.hvd.fit import fit_hvd_generations

    gens = synthetic_generations(num_requests=24, seed=4, vocab=300, prompt_len=40, output_len=60)
    res = fit_hvd_generations(gens, None, replay_config=HvdReplayConfig(k=K), payoff_config=PayoffConfig(epochs=2),
                              routers=("cache", "arctic", "mlp", "survival"), ablation=False)
    v, m = res.verdict, res.metrics
    assert set(v["dataset"]) == set(m["dataset"]) - {"overall"}
    for row in v.iter_rows(named=True):
        for router in ("model", "suffix", "cache", "arctic", "mlp", "survival"):
            tp = m.filter((m["router"] == router) & (m["dataset"] == row["dataset"]))["throughput"][0]
            assert row[router] == pytest.approx(tp, rel=1e-9), (row["dataset"], router)
            cyc = m.filter((m["router"] == router) & (m["dataset"] == row["dataset"]))["cycles_per_1k"][0]
            assert row[f"cycles_per_1k[{router}]"] == pytest.approx(cyc, rel=1e-9), (row["dataset"], router)
        assert row["best_single"] == max(row["model"], row["suffix"])
        hvd = ("cache", "arctic", "table", "mlp", "survival", "survival+budget")
        assert row["best_hvd"] == max(row[r] for r in hvd if r in row)
        fewer = 1 - row[f"cycles_per_1k[{row['best_router']}]"] / row[f"cycles_per_1k[{row['best_single_router']}]"]
        assert row["fewer_cycles"] == pytest.approx(fewer)
        assert row["holds"] == (row["best_hvd"] >= 0.99 * row["best_single"])
        # the clairvoyant router bounds every router, the joint one (with its catch-up) included
        assert row["oracle"] >= max(row[r] for r in ("model", "suffix", *hvd) if r in row) - 1e-12
        assert row["headroom"] == pytest.approx(row["oracle"] / row["best_single"])
    assert {"c_draft", "c_verify", "c_cache"} <= set(m.columns) and (m["c_draft"] == 0.33).all()
