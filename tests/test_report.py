"""`avkit report`: every section renders from a small synthetic fit, the numbers in the HTML equal
scores.json (and an independent sklearn AUC), the Markdown carries the same tables, reliability bins
reproduce the fit's ECE, missing inputs omit their section with a note, and a failed run leaves the
previous report untouched."""

import json
import re
import shutil
from html.parser import HTMLParser

import numpy as np
import polars as pl
import pytest

from avkit.config import EstimatorConfig, FitConfig, PayoffConfig, ReportConfig, SyntheticConfig, TuneConfig
from avkit.errors import ConfigError, DataError
from avkit.fit import run_fit, write_fit_outputs
from avkit.hvd.fit import fit_hvd_generations
from avkit.hvd.replay import synthetic_generations
from avkit.report import report_fit_dir, report_traces
from avkit.markdown import fmt
from avkit.report.inputs import load_fit_dir, load_inputs
from avkit.report.sections import SECTIONS
from avkit.report.sections.online import pearson
from avkit.report.sections.reliability import reliability_bins
from avkit.report.sections.simulation import pareto_mask
from avkit.scheduling.cost import resolve_cost
from avkit.staged import write_json_atomic
from avkit.sim.replay import simulate, write_results
from avkit.trace.reader import read_traces
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune import tune

TRUTH = SyntheticConfig(num_slots=24_000, datasets=("code", "chat", "tool"), mix=(1, 1, 1),
                        feature_means=(2.5, 1.0, 0.0), steps_per_request=32, seed=3)
NOWHERE = ReportConfig(sim="/nonexistent/sim.parquet", hvd="/nonexistent/hvd.json", tune="/nonexistent/tune.json")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A synthetic trace, its simulation and HVD results, and the full report built from them."""
    root = tmp_path_factory.mktemp("report")
    trace = write_synthetic_trace(root / "t.parquet", TRUTH)
    sim = simulate([trace], resolve_cost("roofline:H200:8b"), (1, 8, 64),
                   ["nospec", "fixed:2", "fixed:4", "fixed:7", "adaptive:online_logistic"])
    write_results(sim, root / "sim.parquet")
    fit_hvd_generations(synthetic_generations(10, seed=0, output_len=120), root / "hvd",
                        payoff_config=PayoffConfig(epochs=2), ablation=False)
    write_json_atomic(root / "tune.json", tune([trace], TuneConfig(concurrency=(1, 8, 64), context=4096, bootstrap=50)))
    out = report_traces([trace], root / "out", NOWHERE, sim=root / "sim.parquet", hvd=root / "hvd",
                        tune=root / "tune.json")
    return {"root": root, "trace": trace, "out": out, "html": (out / "index.html").read_text(),
            "md": (out / "report.md").read_text(), "scores": json.loads((out / "fit/scores.json").read_text())}


class Tables(HTMLParser):
    """Every <table> of a page as a list of rows of cell texts (header row first)."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self._cell = [], None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _table(page: str, first_header: str, second_header: str | None = None) -> list[list[str]]:
    for t in Tables(page).tables:
        if t[0][0] == first_header and (second_header is None or t[0][1] == second_header):
            return t
    raise AssertionError(f"no table starting with {first_header!r}")


def _md_tables(md: str) -> list[list[list[str]]]:
    tables, cur = [], None
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip().strip("*") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if cur is None:
                cur = [cells]
                tables.append(cur)
            elif not set("".join(cells)) <= set("-:"):
                cur.append(cells)
        else:
            cur = None
    return tables


def test_every_section_renders(made):
    html, out = made["html"], made["out"]
    for key in SECTIONS:
        assert f'<section id="{key}">' in html
    assert "Omitted" not in html
    pngs = sorted(p.stem for p in out.glob("*.png"))
    assert set(pngs) >= {"acceptance_by_position", "auc_by_position", "reliability", "coefficient_trajectory",
                         "role_analysis", "throughput_vs_concurrency", "pareto", "hvd_speedup", "hvd_cycles",
                         "tune_schedule"}
    for name in pngs:
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}.png)" in made["md"]
    assert html.count('src="data:image/png;base64,') == len(pngs)
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained


def test_html_numbers_equal_scores_json(made):
    table = _table(made["html"], "feature", "estimator")
    header, rows = table[0], table[1:]
    scores = {(r["feature"], r["estimator"], r["scope"]): r for r in made["scores"]}
    pairs = list(dict.fromkeys((r["feature"], r["estimator"]) for r in made["scores"]))
    assert [(r[0], r[1]) for r in rows] == pairs
    for row in rows:
        for col, scope, key in (("AUC", "all", "auc"), ("log-loss", "all", "log_loss"), ("ECE", "all", "ece"),
                                ("AUC pos≥1", "all_but_first", "auc"), ("ECE pos≥1", "all_but_first", "ece")):
            value = scores[row[0], row[1], scope][key]
            assert row[header.index(col)] == fmt(value)
            assert abs(float(row[header.index(col)]) - value) <= 5e-5
        assert row[header.index("observed slots")] == fmt(scores[row[0], row[1], "all"]["n"])


def test_html_auc_matches_sklearn(made):
    """Independent oracle: the q_max (no fit) AUC printed in the page is sklearn's on the raw trace."""
    from sklearn.metrics import roc_auc_score  # lazy: heavy, imported by the tests that use it
    df = read_traces([made["trace"]], ["q_max", "accepted"]).filter(pl.col("accepted").is_not_null())
    table = _table(made["html"], "feature", "estimator")
    row = next(r for r in table[1:] if r[:2] == ["q_max", "qmax"])
    expected = roc_auc_score(df["accepted"].to_numpy(), df["q_max"].to_numpy())
    assert abs(float(row[table[0].index("AUC")]) - expected) <= 5e-5 + 1e-6


def test_markdown_has_the_same_tables(made):
    html_tables = [[[c for c in row] for row in t] for t in Tables(made["html"]).tables]
    md_tables = _md_tables(made["md"])
    assert len(md_tables) == len(html_tables)
    for h, m in zip(html_tables, md_tables):
        assert [[c.replace("\\|", "|") for c in row] for row in m] == h


def test_reliability_reproduces_the_fit(made):
    fit = load_fit_dir(made["out"] / "fit")
    inputs = load_inputs(fit, [made["trace"]])
    bins = reliability_bins(inputs.summary.panels[0][-1])  # the deployed estimator's
    ece = next(r["ece"] for r in fit.scores if r["scope"] == "all" and r["feature"] == fit.coefficients["feature"]
               and r["estimator"] == fit.coefficients["estimator"])
    assert bins["count"].sum() == inputs.summary.counts.sum() == fit.coefficients["trained_on"]["observed"]
    assert bins["ece"] == pytest.approx(ece, abs=1e-12)
    # the replay ends where the fit ended: the deployed coefficients
    table = _table(made["html"], "coefficient")
    assert table[1][1] == fmt(fit.coefficients["slope"])


def test_reliability_reproduces_a_batch_fit_of_a_negated_feature(made, tmp_path):
    """Batch mode and a feature fitted with sign -1 (entropy) replay to the fit's ECE as well."""
    result = run_fit([made["trace"]], FitConfig(mode="batch"), EstimatorConfig(feature="entropy"))
    write_fit_outputs(tmp_path / "fit", result)
    fit = load_fit_dir(tmp_path / "fit")
    bins = reliability_bins(load_inputs(fit).summary.panels[0][-1])
    ece = next(r["ece"] for r in fit.scores if (r["scope"], r["feature"], r["estimator"]) ==
               ("all", "entropy", "batch_logistic"))
    assert bins["ece"] == pytest.approx(ece, abs=1e-12)


def test_role_analysis_recovers_the_synthetic_truth(made):
    """Every dataset shares the true slope and intercepts, so each separate fit lands near them
    (margins: ~4 standard errors at ~2,500 observed slots per dataset)."""
    fit = load_fit_dir(made["out"] / "fit")
    fits = load_inputs(fit, [made["trace"]]).summary.role_fits
    assert [f["dataset"] for f in fits] == ["chat", "code", "tool"]
    for f in fits:
        assert abs(f["slope"] - TRUTH.slope) < 0.12, f
        assert abs(f["b0"] - TRUTH.intercepts[0]) < 0.35, f
    ent = {f["dataset"]: f["entropy"] for f in fits}
    assert ent["code"] < ent["chat"] < ent["tool"]  # feature means 2.5 > 1.0 > 0.0


def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 40):
        x, y = rng.integers(0, 6, n).astype(float), rng.integers(0, 6, n).astype(float)  # with ties
        brute = [not any(x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in range(n))
                 for i in range(n)]
        assert pareto_mask(x, y).tolist() == brute


def test_pearson():
    from scipy.stats import pearsonr  # lazy: heavy, imported by the tests that use it
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=5), rng.normal(size=5)
    assert pearson(x, y) == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    assert pearson(x[:2], y[:2]) is None and pearson(np.ones(4), y[:4]) is None


def test_missing_inputs_are_omitted_with_a_note(made, tmp_path):
    """No simulation, no HVD, traces moved away: those sections say why, the rest renders."""
    fit_dir = tmp_path / "fit"
    shutil.copytree(made["out"] / "fit", fit_dir)
    coef = json.loads((fit_dir / "coefficients.json").read_text())
    coef["trained_on"]["traces"] = [str(tmp_path / "gone.parquet")]
    (fit_dir / "coefficients.json").write_text(json.dumps(coef))
    out = report_fit_dir(fit_dir, tmp_path / "r", NOWHERE)
    html = (out / "index.html").read_text()
    for key in ("reliability", "simulation", "hybrid", "tune"):
        section = html.split(f'<section id="{key}">')[1].split("</section>")[0]
        assert '<p class="note">Omitted: ' in section, key
    assert "avkit simulate" in html and "avkit hvd" in html and "avkit tune" in html and "gone.parquet" in html
    assert _table(html, "feature", "estimator")  # the feature table needs only scores.json
    assert (out / "fit/scores.json").read_text() == (fit_dir / "scores.json").read_text()
    assert "> Omitted: " in (out / "report.md").read_text()


def test_explicit_inputs_must_exist(made, tmp_path):
    with pytest.raises(ConfigError, match="--sim .*nope.parquet: no such file"):
        report_fit_dir(made["out"] / "fit", tmp_path / "r", NOWHERE, sim=tmp_path / "nope.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="bad.parquet: not a readable Parquet"):
        report_fit_dir(made["out"] / "fit", tmp_path / "r", NOWHERE, sim=tmp_path / "bad.parquet")
    bad = tmp_path / "badfit"
    bad.mkdir()
    (bad / "coefficients.json").write_text("{}")
    (bad / "scores.json").write_text("[]")
    with pytest.raises(ConfigError, match="coefficients.json: field 'num_positions' must be an integer"):
        report_fit_dir(bad, tmp_path / "r", NOWHERE)
    assert not (tmp_path / "r").exists()


def test_failed_run_keeps_the_previous_report(made, tmp_path, monkeypatch):
    for key in set(SECTIONS) - {"features"}:  # one cheap section is enough here
        monkeypatch.delitem(SECTIONS, key)
    out = report_fit_dir(made["out"] / "fit", tmp_path / "r", NOWHERE)
    before = (out / "index.html").read_text()
    assert '<section id="features">' in before

    def boom(inputs):
        raise DataError("boom")

    monkeypatch.setitem(SECTIONS, "hybrid", boom)
    with pytest.raises(DataError, match="boom"):
        report_fit_dir(made["out"] / "fit", out, NOWHERE)
    assert (out / "index.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temp directory left behind


def test_trajectory_axis_runs_on_across_traces():
    """Engine steps restart in each trace file: the plot's axis lays them end to end (issue 22 item 2),
    with or without the trajectory's `file` column."""
    from avkit.report.sections.online import global_steps

    step = np.array([100, 200, 250, 100, 200, 50, 100])
    file = np.array([0, 0, 0, 1, 1, 2, 2])
    for f in (file, None):
        x, starts = global_steps(step, f, ["a.parquet", "b.parquet", "c.parquet"])
        assert (np.diff(x) > 0).all()
        assert x.tolist() == [100, 200, 250, 350, 450, 500, 550]
        assert starts == [(250, "b.parquet"), (450, "c.parquet")]


def test_pareto_front_is_over_deployable_policies():
    from avkit.sim.replay import deployable

    df = pl.DataFrame({"policy": ["fixed7", "adaptive-qmax", "adaptive-oracle"], "lossless": [True, True, False],
                       "per_request_tok_s": [10.0, 11.0, 12.0], "throughput_tok_s": [100.0, 105.0, 110.0]})
    dep = deployable(df)
    assert dep.tolist() == [True, True, False]
    assert deployable(df.drop("lossless")).tolist() == [True, True, False]
    front = pareto_mask(df["per_request_tok_s"].to_numpy()[dep], df["throughput_tok_s"].to_numpy()[dep])
    assert front.tolist() == [False, True]  # the oracle would dominate both; it is a bound, not on the front


def test_sections_show_their_inputs(made):
    """Each section names the results file behind it (fit / simulation / HVD) with its traces' hashes."""
    from avkit.provenance import file_sha256

    assert made["html"].count('class="inputs"') >= 4
    assert f"[{file_sha256(made['trace'])[:8]}]" in made["html"]
    assert "Inputs: avkit fit" in made["md"]
