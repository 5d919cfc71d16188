"""forgetting_logistic: its refit schedule and algebra, that it beats the vLLM-style estimator on real
traces its defaults were not tuned on (prequential), and that it deploys: `avkit fit --estimator`, serve and simulate warm-start
from its coefficients file and refit live with it."""

import json
from pathlib import Path

import numpy as np
import pytest

from avkit.cli import app
from avkit.config import EstimatorConfig, ForgettingConfig
from avkit.errors import AvkitError
from avkit.estimators import make_estimator
from avkit.estimators.forgetting_logistic import basis
from avkit.fit.data import load_fit_data
from avkit.fit.replay import online_replay
from avkit.metrics import ece, log_loss

K = 7
ROOT = Path(__file__).resolve().parents[1]


def _feed(est, steps, rng, acc=0.8):
    for _ in range(steps):
        f, pos = rng.normal(2, 2, 24), rng.integers(0, est.k, 24)
        est.update(f, pos, est.predict(f, pos), (rng.uniform(size=24) < acc).astype(float))


def test_rounds_start_short_and_grow_to_the_refit_interval():
    est = make_estimator("forgetting_logistic", k=K)
    rng = np.random.default_rng(0)
    sizes = []
    for _ in range(7):
        sizes.append(est.steps_to_refit)
        _feed(est, est.steps_to_refit, rng)
    assert sizes == [5, 10, 20, 40, 80, 100, 100] and est.rounds == 7


def test_one_round_from_the_prior_is_the_newton_step_of_prior_plus_round():
    """Dense check of the refit: (keep P0 + H) step = g, with P0 the prior precision, on the 2-term basis."""
    est = make_estimator("forgetting_logistic", k=3, config=EstimatorConfig(ridge=0.0),
                         forgetting=ForgettingConfig(young_interval=1, shift_z=1e9))
    rng = np.random.default_rng(1)
    f, pos = rng.normal(1, 2, 400), rng.integers(0, 3, 400)
    y = (rng.uniform(size=400) < 0.7).astype(float)
    p = est.predict(f, pos)
    before = est.coefficients()
    est.update(f, pos, p, y)
    phi = basis(f)
    x = np.column_stack([phi, np.eye(3)[pos]])  # [N, 2 + K] design
    w = p * (1 - p)
    keep = 0.5 ** (1 / 2000)  # one engine step of forgetting (half-life 2000 steps)
    h = x.T @ (x * w[:, None]) + keep * np.diag(np.r_[np.full(2, 3 * 12.5), np.full(3, 12.5)])
    step = np.linalg.solve(h, x.T @ (y - p))
    np.testing.assert_allclose(est.coefficients() - before, step, rtol=1e-9, atol=1e-12)


def test_a_shift_forgets_the_past():
    est = make_estimator("forgetting_logistic", k=K)
    rng = np.random.default_rng(2)
    _feed(est, 255, rng, acc=0.95)  # rounds of 5..80 steps
    calm = est.prec_c.sum()
    shifts = est.shifts
    _feed(est, est.steps_to_refit, rng, acc=0.3)  # acceptance collapses: implausible residuals
    assert est.shifts == shifts + 1 and est.prec_c.sum() < 0.5 * calm + 1e4


def test_batch_fit_is_refused():
    with pytest.raises(AvkitError, match="online only"):
        make_estimator("forgetting_logistic", k=K).fit(np.zeros(3), np.zeros(3, int), np.ones(3))


@pytest.mark.parametrize("name", ["vllm/vllm_greedy_k7.parquet", "reuse/t1_edit_k7.parquet"])
def test_beats_the_vllm_estimator_on_traces_its_defaults_never_saw(name):
    """Prequential, logit(q_max), both from their defaults, on real traces ForgettingConfig was NOT tuned on
    (its defaults were chosen on sampled_t1.0_k7 and greedy_k7, where its ECE of 0.0062 and 0.0080 is
    in-sample): ECE below and log-loss <= the vLLM-style estimator's. ECE <= 0.010 is not claimed: it
    holds on 4 of 17 held-out traces (bench/results/estimators.md, LOTO: vLLM's trace 0.0085 vs
    0.0154, t1 editing 0.0154 vs 0.0589)."""
    data = load_fit_data([ROOT / "traces" / name])
    got = {}
    for est_name in ("online_logistic", "forgetting_logistic"):
        p, _ = online_replay(make_estimator(est_name, k=K), data, data.features["logit_qmax"])
        got[est_name] = (log_loss(data.labels, p), ece(data.labels, p))
    (ll_v, e_v), (ll_f, e_f) = got["online_logistic"], got["forgetting_logistic"]
    assert e_f < e_v and ll_f <= ll_v


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`avkit fit --estimator forgetting_logistic` on the greedy trace -> its coefficients.json."""
    out = tmp_path_factory.mktemp("fit")
    with pytest.raises(SystemExit) as e:
        app(["fit", str(ROOT / "traces/greedy_k7.parquet"), "--estimator", "forgetting_logistic", "--out", str(out)],
            prog_name="avkit")
    assert e.value.code == 0
    return out / "coefficients.json"


def test_fit_writes_a_file_it_warm_starts_from(fitted):
    from avkit.scheduling.adaptive import make_adaptive

    doc = json.loads(fitted.read_text())
    assert doc["estimator"] == "forgetting_logistic" and len(doc["basis_slopes"]) == 2 and "precision" in doc
    policy = make_adaptive(cost="roofline:cpu:1.5b", estimator="forgetting_logistic", coefficients=fitted, k=K)
    est = policy.estimator
    assert est.name == "forgetting_logistic" and est.basis_slopes.tolist() == doc["basis_slopes"]
    np.testing.assert_array_equal(est.prec_c, doc["precision"]["c"])
    rounds = est.rounds
    from avkit.step_types import VerifyOutcome
    import torch

    rng = np.random.default_rng(3)
    for _ in range(est.steps_to_refit):  # the live refits run on it
        f = torch.tensor(rng.normal(2, 2, (4, K)), dtype=torch.float32)
        conf = torch.from_numpy(est.predict(f.numpy().ravel(), np.tile(np.arange(K), 4)).reshape(4, K))
        policy.observe(VerifyOutcome({"logit_qmax": f}, conf, torch.full((4,), K), torch.tensor([7, 2, 0, 5])))
    assert est.rounds == rounds + 1 and policy.refits == 1


def test_simulate_runs_it_warm_started(fitted):
    import polars as pl

    from avkit.scheduling.cost import CostTable
    from avkit.scheduling.spec import parse_spec
    from avkit.sim.drive import SimPolicy, decide
    from avkit.sim.steps import Replay
    from avkit.sim.steps import schedule, step_table
    from avkit.trace.reader import read_traces

    steps = step_table(read_traces([ROOT / "traces/greedy_k7.parquet"]).filter(pl.col("engine_step") < 300))
    cost = CostTable((1, 64, 512), (1.0, 1.6, 20.0), (1, 16), (0.2, 0.6))
    replay = Replay.build(steps, schedule(steps, 8, waves=1), cost)
    policy = SimPolicy(parse_spec("adaptive:forgetting_logistic"), str(fitted), burn_in=False)
    k, drafted, _ = decide(policy.make(steps, cost), replay)
    assert k.shape == drafted.shape and (k <= drafted).all() and k.sum() > 0
    assert policy.name == "adaptive-forgetting_logistic"


def test_serve_uses_it_and_refuses_another_pairs_snapshot(tmp_path):
    from avkit.config import AdaptiveConfig, EngineConfig, ModelsConfig, ServeConfig
    from avkit.errors import ConfigError
    from avkit.models import load
    from avkit.models.testing import write_tiny_model
    from avkit.serve.server import build_state
    from avkit.serve.side_writes import coefficients_of
    from avkit.staged import write_json_atomic

    tpath = write_tiny_model(tmp_path / "target", vocab=384, seed=0)
    dpath = write_tiny_model(tmp_path / "draft", vocab=384, seed=1)
    target, draft = load(tpath), load(dpath)
    config = ServeConfig(models=ModelsConfig(target=str(tpath), draft=str(dpath)), engine=EngineConfig(k=4),
                         adaptive=AdaptiveConfig(estimator="forgetting_logistic", cost="roofline:cpu:1.5b"),
                         snapshot=str(tmp_path / "snap.json"))
    state = build_state(config, target=target, draft=draft)
    est = state.make_engine().policy.estimator
    assert est.name == "forgetting_logistic"  # (the shipped K = 7 fit does not apply to K = 4)
    est.basis_slopes[:] = [0.3, 0.4]
    snap = coefficients_of(est)  # no pair recorded: resumes
    write_json_atomic(tmp_path / "snap.json", {**snap, "trained_on": {"target": str(tpath), "draft": str(dpath)}})
    resumed = build_state(config, target=target, draft=draft).make_engine().policy.estimator
    assert resumed.basis_slopes.tolist() == [0.3, 0.4]
    write_json_atomic(tmp_path / "snap.json", {**snap, "trained_on": {"target": "another-model"}})
    with pytest.raises(ConfigError, match="field 'trained_on.target' does not match the served target"):
        build_state(config, target=target, draft=draft)


def test_fit_warm_starts_through_the_validated_loader(fitted, tmp_path, capsys):
    """`avkit fit --coefficients`: the replay resumes from the file (rounds add up); a file fitted on
    another model pair is refused with one line naming the field."""
    from avkit.config import SyntheticConfig
    from avkit.trace.synthetic import write_synthetic_trace

    greedy = str(ROOT / "traces/greedy_k7.parquet")
    with pytest.raises(SystemExit) as e:
        app(["fit", greedy, "--estimator", "forgetting_logistic", "--coefficients", str(fitted),
             "--out", str(tmp_path / "o")], prog_name="avkit")
    assert e.value.code == 0
    first, again = json.loads(fitted.read_text()), json.loads((tmp_path / "o/coefficients.json").read_text())
    assert again["rounds"] == first["rounds"] + 6  # 669 steps of rounds of 100 after the warm start
    syn = write_synthetic_trace(tmp_path / "syn.parquet", SyntheticConfig(num_slots=7000, seed=1))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        app(["fit", str(syn), "--estimator", "forgetting_logistic", "--coefficients", str(fitted),
             "--out", str(tmp_path / "o2")], prog_name="avkit")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "field 'trained_on.target" in err and not (tmp_path / "o2").exists()


def test_a_warm_start_from_another_estimators_file_refits_young_again():
    """An online_logistic / batch file has no curvature: only the prior backs it, so rounds restart short;
    its own snapshot (with precision) keeps its schedule."""
    other = make_estimator("online_logistic", k=K)
    other.rounds, other.slope = 22, 0.66
    est = make_estimator("forgetting_logistic", k=K)
    est.load_state_dict(other.state_dict())
    assert est.rounds == 0 and est.steps_to_refit == ForgettingConfig().young_interval and est.slope == 0.66
    rng = np.random.default_rng(4)
    for _ in range(3):
        _feed(est, est.steps_to_refit, rng)
    again = make_estimator("forgetting_logistic", k=K)
    again.load_state_dict(est.state_dict())
    assert again.rounds == 3 and again.steps_to_refit == 40
