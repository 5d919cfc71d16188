"""Out-of-core batch fit (fit/passes.py) against the in-memory fit on the same shards:
coefficients within 1e-9, log-loss and ECE within 1e-12, AUC within each row's stated bound,
the bound itself <= 1e-4; chunking does not change the result; bad input names the shard and
leaves nothing behind. The binned AUC (metrics/binned.py) against sklearn's exact AUC."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avkit.cli import app
from avkit.config import FitConfig, SyntheticConfig
from avkit.errors import ConfigError, TraceError
from avkit.fit import run_fit
from avkit.fit.passes import chunk_rows
from avkit.metrics.binned import BinnedScores, auc_from_histogram, logit, quantile_edges
from avkit.trace.synthetic import synthetic_trace, write_synthetic_trace


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    cfgs = [SyntheticConfig(num_slots=60_000, seed=1), SyntheticConfig(num_slots=45_000, seed=2, mix=(0.2, 0.8)),
            SyntheticConfig(num_slots=30_000, seed=3, feature_means=(3.0, 0.5))]
    return [write_synthetic_trace(d / f"replica-{i}.parquet", c) for i, c in enumerate(cfgs)]


@pytest.fixture(scope="module")
def in_memory(fleet):
    return run_fit(fleet, FitConfig(mode="batch"))


def _settled(doc: dict) -> dict:
    """A coefficients document less its slope, intercepts and the time its inputs record was written."""
    trained_on = {**doc["trained_on"], "inputs": {**doc["trained_on"]["inputs"], "written": None}}
    return {**{k: v for k, v in doc.items() if k not in ("slope", "intercepts")}, "trained_on": trained_on}


def check_same_fit(ours, ref, *, coef_tol=1e-9, metric_tol=1e-12):
    """The shared acceptance bar of the out-of-core engines (also used by test_distributed_fit.py)."""
    a, b = ours.coefficients, ref.coefficients
    assert abs(a["slope"] - b["slope"]) <= coef_tol
    assert np.abs(np.subtract(a["intercepts"], b["intercepts"])).max() <= coef_tol
    assert _settled(a) == _settled(b)
    ref_rows = {(r["feature"], r["estimator"], r["scope"]): r for r in ref.scores}
    assert len(ours.scores) == len(ref_rows)
    for r in ours.scores:
        q = ref_rows[(r["feature"], r["estimator"], r["scope"])]
        assert r["n"] == q["n"]
        assert abs(r["log_loss"] - q["log_loss"]) <= metric_tol and abs(r["ece"] - q["ece"]) <= metric_tol
        assert r["auc_bound"] <= 1e-4, r
        assert abs(r["auc"] - q["auc"]) <= r["auc_bound"], (r, q)
    slope_cols = [c for c in ours.trajectory.columns if c.startswith(("slope", "intercept"))]
    assert ours.trajectory.height == ref.trajectory.height
    assert np.abs(ours.trajectory.select(slope_cols).to_numpy() - ref.trajectory.select(slope_cols).to_numpy()).max() \
        <= coef_tol


def test_streaming_equals_in_memory(fleet, in_memory):
    check_same_fit(run_fit(fleet, FitConfig(mode="batch", engine="streaming")), in_memory)


def test_small_chunks_change_nothing(fleet, in_memory):
    fit = FitConfig(mode="batch", engine="streaming", memory_budget=256)
    assert chunk_rows(fit) < 60_000  # several chunks per shard
    check_same_fit(run_fit(fleet, fit), in_memory)


def test_spills_are_removed(fleet, tmp_path):
    run_fit(fleet[:1], FitConfig(mode="batch", engine="streaming", scratch=str(tmp_path)))
    assert os.listdir(tmp_path) == []


def test_online_mode_is_refused_out_of_core():
    with pytest.raises(ConfigError, match="--engine streaming fits --mode batch"):
        FitConfig(engine="streaming")


def test_bad_value_in_a_later_chunk_names_the_shard_and_writes_nothing(capsys, fleet, tmp_path):
    t = synthetic_trace(SyntheticConfig(num_slots=70_000, seed=4))
    q = t.column("q_max").to_numpy().copy()
    q[66_000] = 1.5
    bad = tmp_path / "replica-bad.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("q_max"), t.schema.field("q_max"), [q]), bad)
    with pytest.raises(TraceError, match=f"{bad}: column 'q_max' is outside") as streaming:
        run_fit([*fleet, bad], FitConfig(mode="batch", engine="streaming", memory_budget=256,
                                         scratch=str(tmp_path / "scratch")))
    with pytest.raises(TraceError) as memory:
        run_fit([bad], FitConfig(mode="batch"))
    assert str(streaming.value) == str(memory.value)  # the row is named by its place in the shard
    assert os.listdir(tmp_path / "scratch") == []
    with pytest.raises(SystemExit) as exit_:
        app(["fit", str(fleet[0]), str(bad), "--mode", "batch", "--engine", "streaming",
             "--out", str(tmp_path / "out")], prog_name="avkit")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and str(bad) in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("first,repeat", [(3, 66_000), (35_000, 40_000)])  # across chunks; inside one
def test_a_repeated_slot_is_refused_as_in_memory(tmp_path, first, repeat):
    t = synthetic_trace(SyntheticConfig(num_slots=70_000, seed=5))
    rows = list(range(t.num_rows))
    rows[repeat] = first  # row `repeat` repeats row `first`'s slot (chunks of 32,768 rows at a 256 MB budget)
    bad = tmp_path / "replica-dup.parquet"
    pq.write_table(t.take(rows).replace_schema_metadata(t.schema.metadata), bad)
    fit = FitConfig(mode="batch", engine="streaming", memory_budget=256, scratch=str(tmp_path / "scratch"))
    assert chunk_rows(fit) == 32_768
    with pytest.raises(TraceError) as streaming:
        run_fit([bad], fit)
    with pytest.raises(TraceError) as memory:
        run_fit([bad], FitConfig(mode="batch"))
    assert str(streaming.value) == str(memory.value)
    assert f"{bad}: row {first} duplicates another row of the same draft slot" in str(streaming.value)
    assert os.listdir(tmp_path / "scratch") == []


def test_cli_streaming_writes_the_outputs(capsys, fleet, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        app(["fit", str(fleet[0].parent), "--mode", "batch", "--engine", "streaming", "--memory-budget", "600",
             "--out", str(tmp_path / "out")], prog_name="avkit")
    assert exit_.value.code in (0, None)
    rows = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert all(0 <= r["auc_bound"] <= 1e-4 for r in rows)


# ---- binned AUC ----

@pytest.mark.parametrize("seed", range(4))
def test_binned_auc_is_within_its_bound_of_the_exact_auc(seed):
    from sklearn.metrics import roc_auc_score  # lazy: heavy, imported by the tests that use it
    rng = np.random.default_rng(seed)
    n = 200_000
    z = rng.normal(rng.uniform(-1, 2), rng.uniform(0.5, 3), n)
    z[rng.uniform(size=n) < 0.05] = 4.0  # a block of exact ties (a clamped feature)
    p = 1 / (1 + np.exp(-z))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(0.8 * z + 0.3)))).astype(float)
    group = rng.integers(0, 3, n)
    for bins in (64, 1 << 16):
        acc = BinnedScores.zeros(1, 3, 10, quantile_edges(logit(p[rng.integers(0, n, 1 << 17)]), bins))
        for lo in range(0, n, 70_000):  # chunks add up
            acc.add(p[lo:lo + 70_000], y[lo:lo + 70_000], group[lo:lo + 70_000])
        auc, bound = acc._scope(np.s_[:, :])
        exact = roc_auc_score(y, p)
        assert abs(auc - exact) <= bound
        if bins == 64:
            assert bound > 1e-3  # coarse bins: a loose bound, honestly reported
    assert abs(auc_from_histogram(acc.hist.sum((0, 1)))[1] - bound) > 1e-4  # the tie block is exact
    assert bound <= 1e-4 and abs(auc - exact) <= 1e-5


def test_binned_auc_one_class_is_nan():
    auc, bound = auc_from_histogram(np.array([[0, 3, 1], [0, 0, 0]]))
    assert np.isnan(auc) and np.isnan(bound)


def test_shard_sums_in_int32_add_up_to_the_int64_total():
    """One shard's counts are int32 (less memory in flight): folding int32 shard sums gives exactly
    the fold of the same sums in int64, and the total counts in int64."""
    rng = np.random.default_rng(5)
    n = 90_000
    p = 1 / (1 + np.exp(-rng.normal(1, 2, n)))
    p[rng.uniform(size=n) < 0.05] = 0.9  # tied blocks
    y = (rng.uniform(size=n) < p).astype(float)
    group = rng.integers(0, 4, n)
    edges = quantile_edges(logit(p[:20_000]), 256)

    def fold(count_type):
        parts = []
        for lo in range(0, n, 30_000):
            part = BinnedScores.zeros(2, 2, 10, edges, count_type)
            part.add(p[lo:lo + 30_000], y[lo:lo + 30_000], group[lo:lo + 30_000])
            assert part.hist.dtype == part.eq.dtype == count_type
            parts.append(part)
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total

    narrow, wide = fold(np.int32), fold(np.int64)
    assert narrow.hist.dtype == narrow.eq.dtype == np.int64
    np.testing.assert_array_equal(narrow.hist, wide.hist)
    np.testing.assert_array_equal(narrow.eq, wide.eq)
    np.testing.assert_array_equal(narrow.ref, wide.ref)
    assert narrow.hist.sum() == n and narrow.rows(["a", "b"]) == wide.rows(["a", "b"])


def test_out_of_order_engine_steps_are_read_alike(fleet, tmp_path):
    """One reader (fit/data.py `read_shard`): a file whose rows are out of engine-step order counts the same
    engine steps in memory and out of core (its distinct engine_step values), in chunks or whole."""
    t = pq.read_table(fleet[2])
    rows = np.random.default_rng(0).permutation(t.num_rows)
    shuffled = tmp_path / "shuffled.parquet"
    pq.write_table(t.take(rows).replace_schema_metadata(t.schema.metadata), shuffled)
    steps = len(set(t.column("engine_step").to_pylist()))
    fits = [run_fit([shuffled], FitConfig(mode="batch", **kw)) for kw in
            ({}, {"engine": "streaming", "memory_budget": 256, "scratch": str(tmp_path / "s")})]
    assert [f.coefficients["trained_on"]["engine_steps"] for f in fits] == [steps, steps]
    check_same_fit(fits[1], fits[0])


def test_no_observed_slot_is_the_same_line_out_of_core(tmp_path):
    t = synthetic_trace(SyntheticConfig(num_slots=700, seed=6))
    i = t.schema.get_field_index("accepted")
    bad = tmp_path / "unlabelled.parquet"
    pq.write_table(t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type)), bad)
    errors = []
    for kw in ({}, {"engine": "streaming", "scratch": str(tmp_path / "s")}):
        with pytest.raises(TraceError) as e:
            run_fit([bad], FitConfig(mode="batch", **kw))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "no observed labels of drafter 'model'" in errors[0]
