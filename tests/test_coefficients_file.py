"""The one validated coefficients loader: every corruption of a valid file is an AvkitError naming the
file and field, or a valid load (then the estimator warm-starts and predicts probabilities); snapshots
carry the served pair and a server refuses another pair's snapshot."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avkit.errors import AvkitError
from avkit.estimators import make_estimator
from avkit.estimators.coefficients import ServedPair, load_coefficients, load_estimator
from avkit.serve.side_writes import coefficients_of

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = json.loads((ROOT / "traces" / "coefficients.json").read_text())
K = SHIPPED["num_positions"]

# ---- corruptions: a path into the document and what to put there ----
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=8), st.lists(st.floats(allow_nan=True), max_size=9), st.dictionaries(
                     st.text(max_size=4), st.integers(), max_size=3))


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value):
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _drop(doc, path):
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


FORGETTING = make_estimator("forgetting_logistic", k=K)
FORGETTING_DOC = {**coefficients_of(FORGETTING), "num_positions": K}
DOCS = [SHIPPED, FORGETTING_DOC]


@st.composite
def corrupted(draw):
    doc = draw(st.sampled_from(DOCS))
    paths = list(_paths(doc))
    path = draw(st.sampled_from(paths))
    how = draw(st.sampled_from(["set", "drop", "text"] if path else ["set", "text"]))
    if how == "drop":
        return doc, json.dumps(_drop(doc, path))
    if how == "text":  # byte-level damage of the serialized file
        text = json.dumps(doc)
        cut = draw(st.integers(0, len(text)))
        return doc, text[:cut] + draw(st.text(max_size=3)) + text[cut + draw(st.integers(0, 3)):]
    return doc, json.dumps(_set(doc, path, draw(JUNK)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corrupted())
def test_any_corruption_is_an_avkit_error_or_a_valid_load(tmp_path, case):
    doc, text = case
    path = tmp_path / "coefficients.json"
    path.write_text(text)
    name = doc.get("estimator", "online_logistic")
    try:
        est = load_estimator(name, path, k=K)
    except AvkitError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    p = est.predict(np.linspace(-40, 40, 3 * K), np.arange(3 * K) % K)
    assert np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()
    state = est.state_dict()
    assert math.isfinite(state["slope"]) and state["slope"] >= 0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("slope", -0.1, "field 'slope' must be a finite number >= 0"),
    ("slope", float("nan"), "field 'slope' must be a finite number >= 0"),
    ("intercepts", [0.0] * (K - 1), f"field 'intercepts' must be a list of {K}"),
    ("feature", "logit_q_sampled", "field 'feature' must be a known lossless feature"),
    ("feature", "q_max", "field 'feature' must be a known lossless feature"),
    ("num_positions", 5, "field 'num_positions' does not match the K being served"),
    ("estimator", "nope", "field 'estimator' must be one of"),
])
def test_each_field_is_named(tmp_path, field, value, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**SHIPPED, field: value}))
    with pytest.raises(AvkitError, match=message) as e:
        load_coefficients(path, k=K)
    assert str(path) in str(e.value)


def test_served_pair_must_match(tmp_path):
    path = tmp_path / "c.json"
    doc = {**SHIPPED, "trained_on": {**SHIPPED["trained_on"], "target": "a", "target_sha256": "aa"}}
    path.write_text(json.dumps(doc))
    load_coefficients(path, k=K, pair=ServedPair(target="other-name", target_sha256="aa"))  # sha256 wins
    with pytest.raises(AvkitError, match="field 'trained_on.target_sha256' does not match the served target"):
        load_coefficients(path, k=K, pair=ServedPair(target="a", target_sha256="bb"))
    with pytest.raises(AvkitError, match="field 'trained_on.draft' does not match the served draft"):
        load_coefficients(path, k=K, pair=ServedPair(draft="another-draft"))


def test_snapshot_carries_the_pair_and_round_trips(tmp_path):
    pair = ServedPair("t-id", "d-id", "t" * 64, "d" * 64)
    est = make_estimator("forgetting_logistic", k=K)
    rng = np.random.default_rng(0)
    for _ in range(40):
        f, pos = rng.normal(2, 2, 30), rng.integers(0, K, 30)
        est.update(f, pos, est.predict(f, pos), (rng.uniform(size=30) < 0.8).astype(float))
    snap = coefficients_of(est, pair)
    assert snap["trained_on"]["target"] == "t-id" and snap["trained_on"]["draft_sha256"] == "d" * 64
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    again = load_estimator("forgetting_logistic", path, k=K, pair=pair)
    f, pos = rng.normal(2, 2, 50), rng.integers(0, K, 50)
    np.testing.assert_array_equal(again.predict(f, pos), est.predict(f, pos))
    with pytest.raises(AvkitError, match="trained_on.target_sha256"):
        load_estimator("forgetting_logistic", path, k=K, pair=ServedPair(target_sha256="x" * 64))
    with pytest.raises(AvkitError, match="load only into 'forgetting_logistic'"):
        load_estimator("online_logistic", path, k=K)
