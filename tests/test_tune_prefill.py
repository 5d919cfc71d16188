"""`avkit tune`'s drafter prefill and cap on new tokens (avkit/tune/prefill.py), each against a plain loop over
the trace's own rows."""

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avkit.config import SyntheticConfig, TuneConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.sim.replay import load_steps
from avkit.trace.reader import read_traces
from avkit.trace.schema import generations_path
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune import tune
from avkit.tune.arms import Arm, simulate_arms
from avkit.tune.prefill import cap_new_tokens, output_tokens, prefill_per_token, prompt_tokens

SMALL = SyntheticConfig(num_slots=7 * 8 * 24 * 3, k=7, trim_prob=0.0, batch_size=8, steps_per_request=24, seed=9)
PROMPT = lambda rid: 40 + 17 * int(rid.removeprefix("req-"))  # a distinct prompt length per request


def _table(prefill_ms: tuple[float, float]) -> CostTable:
    """A CPU-like table: a flat verify curve that makes drafting pay in decode, a linear drafter prefill."""
    return CostTable((1, 8, 64), (100.0, 110.0, 400.0), (1, 16), (20.0, 30.0), prefill_tokens=(16, 512),
                     prefill_ms=prefill_ms, meta={"source": "test", "device": "cpu"})


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = write_synthetic_trace(tmp_path_factory.mktemp("prefill") / "t.parquet", SMALL)
    ids = pl.read_parquet(path, columns=["run_id", "request_id"]).unique().sort("request_id")
    ids = ids.with_columns(pl.col(c).cast(pl.Utf8) for c in ids.columns)
    rid = ids["request_id"].to_list()
    pq.write_table(pa.table({"run_id": ids["run_id"].to_list(), "request_id": rid,
                             "prompt_ids": [[1] * PROMPT(r) for r in rid], "output_ids": [[2] * 5 for _ in rid]}),
                   generations_path(path))
    return path


def _by_loop(path) -> dict[str, tuple[int, list[int]]]:
    """request_id -> (prompt tokens, tokens emitted per step in step order), by a plain loop over slot rows."""
    df = pl.read_parquet(path, columns=["request_id", "step", "num_accepted"]).unique(["request_id", "step"])
    out: dict[str, tuple[int, list[int]]] = {}
    for rid, _step, acc in sorted(df.iter_rows(), key=lambda r: (str(r[0]), r[1])):
        out.setdefault(str(rid), (PROMPT(str(rid)), []))[1].append(acc + 1)
    return out


def test_prompt_tokens_join_each_request_in_step_table_order(trace):
    rows = read_traces([str(trace)])
    steps = load_steps([str(trace)])
    prompt, tokens = prompt_tokens([str(trace)], rows), output_tokens(steps)
    loop = _by_loop(trace)
    assert prompt.shape == tokens.shape == (len(loop),)
    # request i of the step table: its prompt and its emitted tokens belong to the same recorded request
    pairs = sorted((int(p), int(t)) for p, t in zip(prompt, tokens))
    assert pairs == sorted((p, sum(emitted)) for p, emitted in loop.values())


@pytest.mark.parametrize("cap", [1, 5, 30, 10_000])
def test_cap_keeps_each_request_up_to_its_nth_token(trace, cap):
    steps = load_steps([str(trace)])
    capped = cap_new_tokens(steps, cap)
    want = {}  # prompt -> tokens emitted under the cap, by a loop: steps run while fewer than cap were emitted
    for p, emitted in _by_loop(trace).values():
        total = 0
        for e in emitted:
            if total >= cap:
                break
            total += e
        want[p] = total
    prompt = prompt_tokens([str(trace)], read_traces([str(trace)]))
    assert {int(p): int(t) for p, t in zip(prompt, output_tokens(capped))} == want
    assert capped.label.shape[0] == capped.request.size and np.all(np.diff(capped.request) >= 0)


def test_drafting_arms_pay_the_prompt_prefill_over_the_output_tokens(trace):
    """Every token an arm that drafts emits for request r carries prefill_ms(prompt_r) / (r's output tokens)."""
    steps, cost = load_steps([str(trace)]), _table((32.0, 1024.0))
    prompt = prompt_tokens([str(trace)], read_traces([str(trace)]))
    per_token = prefill_per_token(steps, prompt, cost)
    arms = [Arm("nospec", 0), Arm("fixed", 3), Arm("fixed", 7)]
    sim = dict(waves=1, estimator="online_logistic", gate=True)
    plain = {c.arm.name: c for c in simulate_arms(steps, arms, cost, [1, 4], **sim)
             if c.concurrency == 1}
    priced = {c.arm.name: c for c in simulate_arms(steps, arms, cost, [1, 4], prefill=per_token, **sim)
              if c.concurrency == 1}
    assert priced["nospec"].throughput == plain["nospec"].throughput  # no drafter, nothing to prefill
    price = 32.0 + (prompt - 16) * (1024.0 - 32.0) / (512 - 16)  # the table's curve, linear between its points
    emitted = {rid: sum(e) for rid, (p, e) in _by_loop(trace).items()}
    length = np.array([emitted[f"req-{(int(p) - 40) // 17}"] for p in prompt])  # [R] by the loop, per prompt
    # K = 7 is the recorded K: at c=1 each request runs once, whole, and pays exactly its prompt's price
    assert priced["fixed7"].time_ms == pytest.approx(plain["fixed7"].time_ms + price, rel=1e-9)
    for name in ("fixed3", "fixed7"):
        fixed, base = priced[name], plain[name]
        extra = base.tokens * price / length
        assert fixed.time_ms == pytest.approx(base.time_ms + extra, rel=1e-9)
        assert fixed.throughput == pytest.approx(1e3 * base.tokens.sum() / (base.time_ms + extra).sum(), rel=1e-9)
        assert fixed.metrics["decode_tok_s"] == base.throughput
        assert fixed.metrics["drafter_prefill_share"] == pytest.approx(extra.sum() / fixed.time_ms.sum())


def test_a_dear_prefill_turns_the_schedule_off_and_a_free_one_changes_nothing(trace, tmp_path):
    conc, opts = (1, 2), dict(concurrency=(1, 2), bootstrap=20, max_k=3, memory_gb=0.0)
    free, dear = tmp_path / "free.json", tmp_path / "dear.json"
    _table((0.0, 0.0)).save(free)
    _table((5_000.0, 100_000.0)).save(dear)
    no_gen = tmp_path / "copy.parquet"
    no_gen.write_bytes(trace.read_bytes())  # no generations table beside it: prefill not priced
    plain = tune([no_gen], TuneConfig(cost=str(free), context=512, **opts))
    zero = tune([trace], TuneConfig(cost=str(free), **opts))
    assert [r["k"] for r in plain["schedule"]["per_concurrency"]] == [r["k"] for r in zero["schedule"]["per_concurrency"]]
    assert any(r["k"] > 0 for r in zero["schedule"]["per_concurrency"])  # the table makes drafting pay in decode
    assert [c["throughput_tok_s"] for c in plain["cells"]] == pytest.approx([c["throughput_tok_s"] for c in zero["cells"]])
    assert zero["prefill"]["priced"] and not plain["prefill"]["priced"]
    off = tune([trace], TuneConfig(cost=str(dear), **opts))
    assert [r["k"] for r in off["schedule"]["per_concurrency"]] == [0] * len(conc)
    assert off["prefill"]["drafter_ms_per_request"] > 5_000
    # a prefill that lowers the drafting arms' throughput without turning c=1 off: the catch-up rule's saving
    # stays decode-only (it prices the prefill itself), so it equals the free-prefill run's
    cheap = tmp_path / "cheap.json"
    _table((16.0, 512.0)).save(cheap)
    some = tune([trace], TuneConfig(cost=str(cheap), **opts))
    cells = {(c["arm"], c["concurrency"]): c for c in some["cells"]}
    arm = some["schedule"]["per_concurrency"][0]["arm"]
    assert arm != "nospec" and cells[arm, 1]["throughput_tok_s"] < cells[arm, 1]["decode_tok_s"]
    assert cells[arm, 1]["drafter_prefill_share"] > 0 and cells["nospec", 1]["drafter_prefill_share"] == 0
    want = 1000 / cells["nospec", 1]["decode_tok_s"] - 1000 / cells[arm, 1]["decode_tok_s"]
    assert some["schedule"]["catch_up"]["saving_ms"][0] == pytest.approx(want, rel=1e-12)


def test_cap_and_missing_generations_rows_are_reported(trace, tmp_path):
    capped = tune([trace], TuneConfig(cost=str(_save(tmp_path)), concurrency=(1,), bootstrap=20, max_k=2,
                                      max_new_tokens=8))
    assert capped["idle"]["output_tokens"] < 8 + SMALL.k + 1 and capped["config"]["max_new_tokens"] == 8
    assert any("capped at 8 new tokens" in n for n in capped["notes"])
    with pytest.raises(ConfigError, match="--max-new-tokens"):
        TuneConfig(max_new_tokens=-1)
    lone = tmp_path / "lone.parquet"
    lone.write_bytes(trace.read_bytes())
    pq.write_table(pa.table({"run_id": ["synthetic"], "request_id": ["req-0"], "prompt_ids": [[1, 2]],
                             "output_ids": [[3]]}), generations_path(lone))
    lines = []
    result = tune([lone], TuneConfig(cost=str(_save(tmp_path)), concurrency=(1,), bootstrap=20, max_k=1),
                  warn=lines.append)
    n = result["requests"]
    assert len(lines) == 1 and lines[0].startswith(f"{n - 1} of {n} requests have no generations row")
    assert result["idle"]["prompt_tokens"] == 2.0  # no other row in any dataset: every request priced at req-0's


def test_a_request_without_a_generations_row_is_priced_at_its_datasets_mean_prompt(trace, tmp_path):
    gone = {"req-1", "req-2", "req-5"}
    partial = tmp_path / "partial.parquet"
    partial.write_bytes(trace.read_bytes())
    gens = pl.read_parquet(generations_path(trace)).filter(~pl.col("request_id").is_in(list(gone)))
    gens.write_parquet(generations_path(partial))
    rows = read_traces([str(partial)])
    dataset = {str(r): str(d) for r, d in rows.select("request_id", "dataset").unique().iter_rows()}
    kept = {}  # dataset -> prompt lengths of its requests that kept their row, by a loop
    for rid, ds in dataset.items():
        if rid not in gone:
            kept.setdefault(ds, []).append(PROMPT(rid))
    want = sorted(sum(kept[ds]) / len(kept[ds]) if rid in gone else PROMPT(rid) for rid, ds in dataset.items())
    lines = []
    got = prompt_tokens([str(partial)], rows, lines.append)
    assert sorted(got.tolist()) == pytest.approx(want, rel=1e-12)
    assert len(lines) == 1 and lines[0].startswith(f"3 of {len(dataset)} requests have no generations row")
    assert prompt_tokens([str(trace)], read_traces([str(trace)]), lines.append) is not None and len(lines) == 1


def _save(tmp_path):
    path = tmp_path / "cost.json"
    _table((32.0, 1024.0)).save(path)
    return path
