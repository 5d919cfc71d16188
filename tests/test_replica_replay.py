"""`avkit fit --mode online --replicas independent` (fit/replay.py `online_replicas`): each trace file is a replica
replayed on its own estimator. Oracle: each replica fitted alone (`--replicas chain` on that one
file, the long-standing replay) gives the same refits, and the written estimator is the replica
with the most observed slots."""

import pytest

from avkit.config import FitConfig, SyntheticConfig
from avkit.errors import ConfigError
from avkit.fit import run_fit
from avkit.trace.synthetic import write_synthetic_trace


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("replicas")
    return [write_synthetic_trace(d / f"replica-{i}.parquet", SyntheticConfig(num_slots=n, seed=i))
            for i, n in enumerate((14_000, 28_000, 7_000))]


def _refits(frame):
    return frame.drop("file").to_dicts()


def test_each_replica_replays_as_if_alone(fleet):
    fleet_fit = run_fit(fleet, FitConfig(mode="online", replicas="independent"))
    alone = [run_fit([p], FitConfig(mode="online")) for p in fleet]
    traj = fleet_fit.trajectory
    for i, single in enumerate(alone):
        assert single.trajectory.height > 0
        assert _refits(traj.filter(traj["file"] == i)) == _refits(single.trajectory)
    # written: the replica with the most observed slots (the 28k one), exactly as fitted alone
    best = max(range(3), key=lambda i: alone[i].coefficients["trained_on"]["observed"])
    assert best == 1
    for key in ("slope", "intercepts", "observations", "refits"):
        assert fleet_fit.coefficients[key] == alone[best].coefficients[key], key
    # scored on every replica's slots, and different from one estimator carried through them all
    chain = run_fit(fleet, FitConfig(mode="online"))
    assert fleet_fit.scores[0]["n"] == chain.scores[0]["n"] == sum(a.scores[0]["n"] for a in alone)
    assert fleet_fit.coefficients["slope"] != chain.coefficients["slope"]


def test_replicas_are_refused_where_they_mean_nothing():
    with pytest.raises(ConfigError, match="add --replicas independent"):
        FitConfig(mode="online", engine="ray")
    with pytest.raises(ConfigError, match="--replicas independent: only --mode online"):
        FitConfig(mode="batch", replicas="independent")
    with pytest.raises(ConfigError, match="replicas"):
        FitConfig(replicas="parallel")
