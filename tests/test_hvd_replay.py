"""HVD trace replay: the oracle accepted length equals a direct comparison against a cache rebuilt
from scratch; model accepted lengths from the trace recover the truth; the vectorized decode-path
simulation equals a scalar loop; fit_hvd runs end to end on traces written to disk."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from avkit.config import HvdCostConfig, HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.hvd.cost import cost_from_json, linear_table
from avkit.hvd.features import accept_lengths
from avkit.hvd.markdown import hvd_markdown
from avkit.hvd.path import Route, simulate_paths
from avkit.hvd.replay import matches_from_trace, replay, synthetic_generations
from avkit.hvd.suffix_cache import SuffixCache

LOCAL = SuffixCacheConfig(max_depth=8, use_global=False)


@pytest.fixture(scope="module")
def gens():
    return synthetic_generations(num_requests=6, seed=3, vocab=60, prompt_len=40, output_len=60)


def test_oracle_accepted_length_equals_direct_comparison(gens):
    table = replay(gens, LOCAL, HvdReplayConfig(k=5))
    rng = np.random.default_rng(0)
    for g in gens:
        rows = table.filter(pl.col("request_id") == g.request_id).sort("t")
        for t in rng.choice(len(g.output_ids), 15, replace=False):
            fresh = SuffixCache(LOCAL)  # the cache state rebuilt from scratch at position t
            fresh.start_request("x", g.prompt_ids + g.output_ids[:t])
            d = fresh.draft("x", k=5)
            truth = np.asarray(g.output_ids[t:t + d.draft_len])
            drafted = np.asarray(d.tokens[:len(truth)])
            mism = np.flatnonzero(drafted != truth)
            direct = int(mism[0]) if mism.size else len(truth)
            assert rows["draft_len"][int(t)] == d.draft_len
            assert rows["match_len"][int(t)] == d.match_len
            assert rows["cache_acc"][int(t)] == direct


def test_accept_lengths_matches_loop():
    rng = np.random.default_rng(1)
    m = rng.random(200) < 0.7
    want = []
    for t in range(200):
        run = 0
        while t + run < 200 and m[t + run] and run < 4:
            run += 1
        want.append(run)
    assert accept_lengths(m, 4).tolist() == want


def _greedy_trace(out: list[int], match: np.ndarray, k: int, base: int, rid: str) -> list[dict]:
    """Rows a greedy engine would write when its draft's teacher-forced matches are `match`."""
    rows, o, step = [], base, 0
    while o < len(out):
        drafts, acc = [], None
        for j in range(k):
            p = o + j
            ok = acc is None and p < len(out) and match[p]
            drafts.append(out[p] if ok else (out[p] + 1 if p < len(out) else 0) if acc is None else 7)
            if acc is None and not ok:
                acc = j
        acc = k if acc is None else acc
        rows += [{"request_id": rid, "step": step, "position": j, "draft_token": d, "num_accepted": acc,
                  "drafter": "model"} for j, d in enumerate(drafts)]
        o += acc + 1
        step += 1
    return rows


def write_trace_rows(path, rows: list[dict], k: int) -> None:
    """A schema-valid greedy trace (every column, avkit.k) around `_greedy_trace` rows."""
    from avkit.trace.writer import TraceWriter

    df = pl.DataFrame(rows)
    pos, acc = df["position"].to_numpy(), df["num_accepted"].to_numpy()
    n = df.height
    with TraceWriter(path, {"avkit.k": str(k), "avkit.temperature": "0.0"}) as w:
        w.write({**{c: df[c].to_list() for c in df.columns}, "run_id": ["r"] * n, "dataset": ["d"] * n,
                 "q_max": [0.9] * n, "q_2nd": [0.05] * n, "q_sampled": [0.9] * n, "entropy": [0.3] * n,
                 "logit_qmax": [2.2] * n, "target_prob": [0.5] * n, "verified": [True] * n,
                 "accepted": [bool(p < a) if p <= a else None for p, a in zip(pos, acc)],
                 "num_drafted": [k] * n, "num_verified": [k] * n, "batch_size": [1] * n,
                 "step_time_ms": [1.0] * n, "temperature": [0.0] * n, "top_p": [1.0] * n,
                 "engine_step": df["step"].to_list()})


@pytest.mark.parametrize("base", [0, 1])
def test_model_matches_from_trace_recover_truth(base):
    rng = np.random.default_rng(base)
    gens, rows, truth = [], [], {}
    for r in range(3):
        out = rng.integers(10, 100, 80).tolist()
        m = rng.random(80) < 0.8
        rows += _greedy_trace(out, m, 5, base, f"r{r}")
        gens.append({"request_id": f"r{r}", "output_ids": out})
        truth[f"r{r}"] = m
    got, known = matches_from_trace(pl.DataFrame(rows), pl.DataFrame(gens))
    for r, m in truth.items():
        assert np.array_equal(got[r][known[r]], m[known[r]])  # every labelled position is exact
        assert got[r][~known[r]].all()  # unknown ones are filled with True
        assert 0.6 < known[r].mean() < 1.0  # only bonus positions (and the prefill token) are unknown


def test_path_simulation_equals_scalar_loop(gens):
    table = replay(gens, LOCAL, HvdReplayConfig(k=5))
    rng = np.random.default_rng(2)
    use = rng.random(table.height) < 0.5
    vlen = rng.integers(0, 6, table.height)
    cost = linear_table()
    paths = simulate_paths(table, Route(use, vlen), cost, 5).sort("request_id")
    for g in gens:
        rows = table.filter(pl.col("request_id") == g.request_id).sort("t")
        dl, ca, ma = (rows[c].to_list() for c in ("draft_len", "cache_acc", "model_acc"))
        i0 = int(np.flatnonzero(table["request_id"].to_numpy() == g.request_id)[0])
        t, cycles, spent = 0, 0, 0.0
        while t < len(g.output_ids):
            if use[i0 + t]:
                v = min(vlen[i0 + t], dl[t])
                a = min(ca[t], v)
                spent += 1 + HvdCostConfig.verify_token_cost * (1 + v) + cost.lookup_ms
            else:
                a = ma[t]
                spent += 1 + HvdCostConfig.verify_token_cost * 6 + HvdCostConfig.draft_step_cost * 5 + cost.lookup_ms
            t, cycles = t + a + 1, cycles + 1
        got = paths.filter(pl.col("request_id") == g.request_id)
        assert got["cycles"][0] == cycles
        assert got["cost"][0] == pytest.approx(spent)


def test_fit_hvd_on_traces(tmp_path):
    from avkit.hvd.fit import fit_hvd
    from avkit.trace.schema import generations_path

    gens = synthetic_generations(num_requests=10, seed=4, vocab=60, prompt_len=40, output_len=50, model_rate=1.0)
    trace = tmp_path / "greedy.parquet"
    rows = []
    for g in gens:
        rows += _greedy_trace(g.output_ids, np.ones(len(g.output_ids), bool), 4, 1, g.request_id)
    write_trace_rows(trace, rows, k=4)
    pl.DataFrame({"request_id": [g.request_id for g in gens], "dataset": [g.dataset for g in gens],
                  "prompt_ids": [g.prompt_ids for g in gens], "output_ids": [g.output_ids for g in gens]}
                 ).write_parquet(generations_path(trace))
    res = fit_hvd([trace], tmp_path / "out", replay_config=HvdReplayConfig(k=4),
                  payoff_config=PayoffConfig(epochs=2), routers=("arctic", "mlp"))
    assert (tmp_path / "out" / "payoff_mlp.pt").is_file()
    assert (tmp_path / "out" / "hvd_metrics.json").is_file()
    overall = res.metrics.filter(pl.col("dataset") == "overall")
    assert set(overall["router"]) == {"model", "suffix", "arctic", "mlp"}
    # every generation here is matched by the draft model: model-only accepts K=4 on all full steps
    model = overall.filter(pl.col("router") == "model")
    assert model["mean_accepted"][0] > 3.5
    assert res.info["temperatures"] == [0.0]
    md = hvd_markdown(res, "t", others={"other cost": res})  # the one renderer: `avkit hvd --markdown`, bench/hvd.py
    assert "Recording temperature(s): [0.0]" in md and "## Cost sensitivity: other cost" in md
    assert all(md.count(f"| {r} | overall |") == 2 for r in overall["router"])


def test_cli_builds_configs_and_maps_errors(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    import avkit.hvd.fit
    from avkit.cli import hvd as hvd_cli
    from avkit.hvd.fit import HvdResult

    app = typer.Typer()
    hvd_cli.register(app)
    app.command("noop")(lambda: None)  # keep `hvd` a sub-command
    calls = {}

    def fake_fit(paths, out, **kw):
        calls.update(paths=paths, out=out, **kw)
        cols = ("cycles_per_1k", "mean_accepted", "cache_share", "precision", "recall", "speedup_vs_model",
                "speedup_vs_suffix", "speedup_vs_target")
        metrics = pl.DataFrame({"router": ["mlp"], "dataset": ["overall"], **{c: [1.0] for c in cols}})
        return HvdResult(metrics, pl.DataFrame(), pl.DataFrame(), {})

    monkeypatch.setattr(avkit.hvd.fit, "fit_hvd", fake_fit)
    trace = tmp_path / "a.parquet"
    trace.write_bytes(b"")  # TRACE arguments resolve to existing files (fit_hvd is patched: never read)
    res = CliRunner().invoke(app, ["hvd", str(trace), "--out", str(tmp_path / "o"), "--k", "5",
                                   "--draft-step-cost", "0.1", "--tokenizer", "none"])
    assert res.exit_code == 0, res.output
    assert calls["paths"] == [trace] and calls["out"] == tmp_path / "o" and calls["tokenizer"] == "none"
    assert calls["replay_config"] == HvdReplayConfig(k=5)
    assert calls["cost"] == cost_from_json(dict(draft_step_cost=0.1))
    monkeypatch.chdir(tmp_path)  # no traces/ here: the shipped ones beside the package, as fit/report find them
    res = CliRunner().invoke(app, ["hvd", "--tokenizer", "none"])
    assert res.exit_code == 0, res.output
    assert [p.name for p in calls["paths"]] == ["greedy_k7.parquet"] and calls["paths"][0].is_absolute()
    import avkit.hvd.replay
    from avkit.errors import ConfigError

    def nothing_shipped():
        raise ConfigError("none")

    monkeypatch.setattr(avkit.hvd.replay, "shipped_traces", nothing_shipped)
    res = CliRunner().invoke(app, ["hvd"])
    assert res.exit_code != 0 and "no trace with a generations table" in str(res.exception)


def test_trace_matches_equal_teacher_forced_draft(tmp_path):
    """A greedy trace recorded by `avkit record` (tiny target + a slightly perturbed copy as draft):
    model matches read from the trace equal one teacher-forced draft forward at every labelled
    position (docs/hvd.md replay shortcut), and the step-offset detection agrees with the engine."""
    import json

    import torch

    from avkit.config import EngineConfig, RecordConfig, SamplingConfig
    from avkit.hvd.replay import matches_from_draft
    from avkit.models import load
    from avkit.models.testing import write_tiny_model
    from avkit.record import record
    from avkit.trace.schema import generations_path

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load(write_tiny_model(tmp_path / "t", vocab=320, seed=0, init_std=0.3))
        draft = load(tmp_path / "t")
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in draft.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.03 * p.std())
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("def add(a, b):", "Hello", "x = 1")))
        out = tmp_path / "greedy.parquet"
        record(RecordConfig(decoding=EngineConfig(k=4, concurrency=2, seed=0),
                            sampling=SamplingConfig(temperature=0.0, max_new_tokens=24),
                            dataset=(str(prompts),), num_prompts=3, out=str(out)),
               target=target, draft=draft, progress=False)
        gens = pl.read_parquet(generations_path(out)).with_columns(pl.col("request_id").cast(pl.String))
        match, known = matches_from_trace(pl.read_parquet(out), gens)
        hits = 0
        for r, p, o in zip(gens["request_id"], gens["prompt_ids"], gens["output_ids"]):
            tf = matches_from_draft(draft, list(p), list(o))
            assert np.array_equal(tf[known[r]], match[r][known[r]]), r
            assert known[r].mean() > 0.7
            hits += int(tf.sum())
        assert 0 < hits < sum(len(o) for o in gens["output_ids"])  # both outcomes occur
    finally:
        torch.set_num_threads(before)


def test_token_classes_of_byte_level_and_sentencepiece_entries():
    """Each entry is classified by its text: byte-level stand-ins decoded (`Ġ` space, `Ċ` newline, `âĢĶ` an em
    dash), a sentencepiece `▁` read as a space, a lone continuation byte (`Ã`) the replacement character."""
    from avkit.hvd.features import CLASSES, class_table

    got = class_table(["Ġhello", "Ċ", "ĠâĢĶ", "▁the", "12", "_x", "Ã", "<|im_start|>"])  # [8, 5]
    want = [{"ident", "space"}, {"newline"}, {"space", "punct"}, {"ident", "space"}, {"digit"}, {"ident", "punct"},
            {"punct"}, {"ident", "punct"}]
    assert [{c for c, v in zip(CLASSES, row) if v} for row in got] == want
