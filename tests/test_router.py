"""HVD routers: registry, the ArcticInference rule, the acceptance table against direct counts, tau
selection against brute force, survival routing within the draft, and the fitted routers beating
the worse baseline on a synthetic workload."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from avkit.config import HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.hvd.cost import cost_from_json, linear_table
from avkit.hvd.router import (
    MATCH_BUCKETS,
    ROUTERS,
    AcceptanceTable,
    RouterContext,
    choose_tau,
    make_router,
)
from avkit.errors import ConfigError
from avkit.hvd.features import FEATURE_GROUPS
from avkit.hvd.fit import split_by_request
from avkit.hvd.path import evaluate, full_route, throughput
from avkit.hvd.replay import replay, synthetic_generations

K = 5
FEATS = tuple(n for g in ("base", "history", "copy") for n in FEATURE_GROUPS[g])


@pytest.fixture(scope="module")
def splits():
    gens = synthetic_generations(num_requests=24, seed=5, vocab=200, prompt_len=80, output_len=100)
    table = replay(gens, SuffixCacheConfig(max_depth=12), HvdReplayConfig(k=K))
    lab = split_by_request(table, PayoffConfig())
    return tuple(table.filter(pl.Series(lab == s)) for s in ("train", "val", "test"))


@pytest.fixture(scope="module")
def ctx():
    return RouterContext(K, linear_table(), FEATS, PayoffConfig(epochs=8, batch_size=256))


def test_registry_and_unknown_name():
    assert set(ROUTERS) == {"model", "suffix", "cache", "arctic", "table", "mlp", "survival"}
    with pytest.raises(ConfigError, match="unknown hvd router 'nope'"):
        make_router("nope")


def test_split_is_by_request(splits):
    ids = [set(s["request_id"].unique()) for s in splits]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert all(set(s["dataset"].unique()) == {"code", "chat"} for s in splits)


def test_arctic_rule(splits, ctx):
    test = splits[2]
    r = make_router("arctic").route(test, ctx)
    want = (test["score"].to_numpy() >= K) & (test["draft_len"].to_numpy() > 0)
    assert np.array_equal(r.use_cache, want)


def test_table_matches_direct_counts(splits, ctx):
    train, val, _ = splits
    tab = AcceptanceTable(prior_strength=0.0)
    tab.fit(train, val, ctx)
    rows = train.filter(pl.col("draft_len") > 0)
    b = np.searchsorted(MATCH_BUCKETS, rows["match_len"].to_numpy(), side="right") - 1
    acc, dl = rows["cache_acc"].to_numpy(), rows["draft_len"].to_numpy()
    for bucket in np.unique(b):
        for j in range(K):
            sel = (b == bucket) & (dl > j) & (acc >= j)  # reached slot j
            if sel.sum():
                assert tab.cond[bucket, j] == pytest.approx((acc[sel] > j).mean())


def test_choose_tau_is_best_candidate(splits, ctx):
    _, val, _ = splits
    pred = val["score"].to_numpy()
    tau = choose_tau(pred, val, ctx, grid=10)
    best = throughput(val, full_route(val, pred > tau), ctx.cost, K)
    for q in np.linspace(0, 1, 11):
        other = np.quantile(pred[val["draft_len"].to_numpy() > 0], q)
        assert best >= throughput(val, full_route(val, pred > other), ctx.cost, K) - 1e-12


def test_survival_routes_within_draft(splits, ctx):
    train, val, test = splits
    r = make_router("survival")
    r.fit(train, val, ctx)
    route = r.route(test, ctx)
    dl = test["draft_len"].to_numpy()
    assert (route.verify_len[route.use_cache] >= 1).all()
    assert (route.verify_len[route.use_cache] <= dl[route.use_cache]).all()
    assert not route.use_cache[dl == 0].any()


@pytest.mark.parametrize("name", ["table", "mlp", "survival"])
def test_fitted_router_not_worse_than_worst_baseline(splits, ctx, name):
    train, val, test = splits
    routers = {n: make_router(n) for n in ("model", "cache", name)}
    for r in routers.values():
        r.fit(train, val, ctx)
    m = evaluate(test, {n: r.route(test, ctx) for n, r in routers.items()}, ctx.cost, K)
    tp = dict(m.filter(pl.col("dataset") == "overall").select("router", "throughput").iter_rows())
    # tau is tuned on other requests: allow 5% slack against the better baseline, none against the worse
    assert tp[name] >= min(tp["model"], tp["cache"])
    assert tp[name] >= 0.95 * max(tp["model"], tp["cache"])


@pytest.mark.parametrize("measured", [False, True])
def test_budget_allocation_is_argmax_and_prefixes(measured):
    from avkit.hvd.joint import budget_plan

    rng = np.random.default_rng(0)
    for _ in range(20):
        s = np.cumprod(rng.random((6, K)), axis=1) * (np.arange(K)[None, :] < rng.integers(0, K + 1, 6)[:, None])
        fixed, cv = rng.random() * 2, rng.random() * 0.2
        # a measured curve: flat for a few tokens, then steeper (a CPU's verify), points at odd places
        pts = ((1, 1.0), (3, 1.0 + cv), (9, 1.5 + 4 * cv), (20, 2.5 + 12 * cv)) if measured else ()
        cost = cost_from_json(dict(verify_token_cost=cv, verify_points=pts))
        verify = (lambda t, pts=pts: float(np.interp(t, [p[0] for p in pts], [p[1] for p in pts]))) if measured else \
            (lambda t, cv=cv: 1 + cv * t)  # brute-force oracle of the curve (all tested T lie inside the grid)
        v = budget_plan(s, 6, fixed + cost.verify_cost(np.arange(6 + s.size + 1))).num_verify.numpy()  # [N] verified prefix lengths
        assert ((v >= 0) & (v <= (s > 0).sum(1))).all()
        flat = np.sort(s[s > 0])[::-1]
        ratios = [(6 + flat[:b].sum()) / (fixed + verify(6 + b)) for b in range(len(flat) + 1)]
        got = (6 + sum(s[i, :n].sum() for i, n in enumerate(v))) / (fixed + verify(6 + v.sum()))
        assert got == pytest.approx(max(ratios))


def _lockstep_loop(table, route, cost, k, concurrency):
    """Brute-force oracle of `simulate_batched` with a route: a plain loop over lockstep steps, the next waiting
    request taking a finished one's place; each step's cost written out."""
    rid = table["request_id"].to_list()
    reqs = [[i for i in range(len(rid)) if rid[i] == r] for r in dict.fromkeys(rid)]  # replay rows per request
    dl, ca, ma = (table[c].to_list() for c in ("draft_len", "cache_acc", "model_acc"))
    waiting, live, spent, steps, share = list(range(len(reqs))), {}, 0.0, 0, 0.0
    while waiting or live:
        while waiting and len(live) < concurrency:
            live[waiting.pop(0)] = 0
        model = verified = cache = 0
        for g, t in list(live.items()):
            row = reqs[g][t]
            if route.use_cache[row]:
                v = min(int(route.verify_len[row]), dl[row])
                a, cache = min(ca[row], v), cache + (v > 0)
            else:
                v, a, model = k, min(ma[row], k), model + 1
            verified += v
            live[g] = t + a + 1
        spent += float(cost.verify_cost(len(live) + verified)) + (k * float(cost.draft_pass_cost(model)) if model else 0.0)
        spent += cost.lookup_ms * (len(live) if route.consults_cache else cache)  # one lookup per request
        steps, share = steps + 1, share + cache / len(live)
        live = {g: t for g, t in live.items() if t < len(reqs[g])}
    return {"steps": steps, "throughput": len(rid) / spent, "cache_share": share / steps}


@pytest.mark.parametrize("concurrency", [1, 3, 7])
def test_batched_replay_equals_a_lockstep_loop(splits, ctx, concurrency):
    from avkit.hvd.joint import simulate_batched

    test = splits[2]
    measured = cost_from_json(dict(verify_points=((1, 1.0), (4, 1.1), (8, 2.0), (16, 3.7)),
                                   draft_points=((1, 0.5), (4, 0.6), (16, 1.4))))
    for cost in (ctx.cost, measured):
        for name in ("model", "suffix", "cache", "arctic"):
            route = make_router(name).route(test, ctx)
            got = simulate_batched(test, route, cost, K, concurrency)
            want = _lockstep_loop(test, route, cost, K, concurrency)
            assert got["steps"] == want["steps"], name
            assert got["throughput"] == pytest.approx(want["throughput"]) and \
                got["cache_share"] == pytest.approx(want["cache_share"]), name


def test_split_keeps_a_conversation_together():
    # follow-up turns reuse their first turn's text: one conversation is never both trained on and tested
    rows = [(f"d{d}", f"t/d{d}/p{i}" + (f"/turn{t}" if t else ""))
            for d in range(2) for i in range(9) for t in range(3)]
    table = pl.DataFrame({"dataset": [d for d, _ in rows], "request_id": [r for _, r in rows]})
    lab = split_by_request(table, PayoffConfig(seed=3))
    conv = [r.split("/turn")[0] for _, r in rows]
    seen: dict[str, str] = {}
    for c, s in zip(conv, lab):
        assert seen.setdefault(c, s) == s
    assert {"train", "val", "test"} <= set(lab)


@pytest.mark.parametrize("measured", [False, True])
def test_suffix_route_is_suffix_decoding_alone(splits, ctx, measured):
    """A plain loop: a cache draft is verified whole, no draft leaves a target-only step, the draft model never runs."""
    test = splits[2]
    cost = cost_from_json(dict(verify_points=((1, 1.0), (4, 1.2), (8, 2.0)), draft_points=((1, 9.0),))) if measured \
        else cost_from_json(dict(draft_step_cost=9.0))  # a prohibitive draft model must not matter
    route = make_router("suffix").route(test, ctx)
    dl, acc = test["draft_len"].to_numpy(), test["cache_acc"].to_numpy()
    tokens = spent = 0.0
    for _, part in test.with_row_index("row").group_by("request_id", maintain_order=True):
        rows, t = part["row"].to_numpy(), 0
        while t < len(rows):
            r = rows[t]
            a = min(acc[r], dl[r])
            spent += float(cost.verify_cost(1 + dl[r])) + cost.lookup_ms
            t += a + 1
        tokens += len(rows)
    assert throughput(test, route, cost, K) == pytest.approx(tokens / spent)


@pytest.mark.parametrize("draft_cost", [0.05, 3.0])
def test_model_scale_is_the_validated_best(splits, ctx, draft_cost):
    """The joint router's shrink of the model survival table: the scale among MODEL_SCALES with the best
    joint throughput on the validation requests (recomputed here scale by scale), applied to the table
    the router keeps (ties: the larger)."""
    from avkit.hvd.joint import model_survival_table, simulate_batched
    from avkit.hvd.router import MODEL_SCALES

    train, val, _ = splits
    c = RouterContext(K, cost_from_json(dict(draft_step_cost=draft_cost)), FEATS, ctx.payoff)
    r = make_router("survival")
    r.fit(train, val, c)
    raw = model_survival_table(train, r.hit_bins, K)
    assert r.model_scale in MODEL_SCALES and np.allclose(r.model_surv, r.model_scale * raw)
    tps = {}
    for s in MODEL_SCALES:
        r.model_surv = s * raw
        tps[s] = simulate_batched(val, full_route(val, np.ones(val.height, bool)), c.cost, K, 1,
                                  r.survivals(val, c))["throughput"]
    chosen = [s for s in MODEL_SCALES if tps[s] >= max(tps.values()) * (1 - 1e-9)]
    assert r.model_scale == chosen[0]  # the first (largest) of the best
    if draft_cost == 3.0:  # a prohibitive draft model: no scale beats cache-or-nothing
        assert max(tps.values()) == pytest.approx(tps[0.0])
