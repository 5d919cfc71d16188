"""`avkit fit --engine ray` on a local Ray cluster (2 CPUs, a 128 MB object store): the same fit
as in memory (coefficients within 1e-9, metrics within the stated bounds) and as the out-of-core
engine; a shard that fails to read is named in one line and nothing is written; a worker killed
mid-fit is retried (same result) or, past the retries, fails cleanly. Skips when Ray is absent
(it is the `distributed` extra)."""

import functools
import os
import signal

import importlib.util

import numpy as np
import pytest

from avkit.cli import app
from avkit.config import FitConfig, SyntheticConfig
from avkit.errors import AvkitError
from avkit.fit import run_fit
from avkit.fit.engines import LocalEngine, RayEngine
from avkit.trace.synthetic import write_synthetic_trace
from test_streaming_fit import _settled, check_same_fit

# Ray is imported by the cluster fixture, not while the suite is collected (seconds of import).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="needs Ray: pip install 'avkit[distributed]'")
BATCH = FitConfig(mode="batch", engine="ray")


@pytest.fixture(scope="module")
def cluster():
    import ray  # lazy: heavy, imported by the tests that use it

    # local_fs_capacity_threshold = 1: Ray refuses every task once the disk is 95 % full (its default), which
    # a shared CI disk can be; these shards are a few MB, so only a truly full disk should stop them.
    ray.init(num_cpus=2, object_store_memory=128 << 20, include_dashboard=False, log_to_driver=False,
             _system_config={"local_fs_capacity_threshold": 1.0})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    return [write_synthetic_trace(d / f"replica-{i}.parquet", SyntheticConfig(num_slots=21_000, seed=i))
            for i in range(3)]


@pytest.fixture(scope="module")
def in_memory(fleet):
    return run_fit(fleet, FitConfig(mode="batch"))


def test_ray_equals_in_memory_and_out_of_core(cluster, fleet, in_memory):
    ours = run_fit(fleet, BATCH)
    check_same_fit(ours, in_memory)
    check_same_fit(ours, run_fit(fleet, FitConfig(mode="batch", engine="streaming")), coef_tol=0.0, metric_tol=0.0)


def test_unreadable_shard_is_named_and_nothing_is_written(cluster, capsys, fleet, tmp_path):
    bad = tmp_path / "replica-bad.parquet"
    data = bytearray(fleet[0].read_bytes())
    data[len(data) // 3: len(data) // 3 + 4096] = os.urandom(4096)  # a corrupt page; the footer is intact
    bad.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exit_:
        app(["fit", str(fleet[1]), str(bad), "--mode", "batch", "--engine", "ray", "--out", str(tmp_path / "out")],
            prog_name="avkit")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("avkit: error: ") and err.count("\n") == 1, err
    assert str(bad) in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _die_first(marker: str, fn, *args):
    """Kill this Ray worker process the first time any task runs (marker file absent), else run fn."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(*args)


def _die_always(fn, *args):
    os.kill(os.getpid(), signal.SIGKILL)


class KillingEngine(RayEngine):
    """Kills the worker running the first shard of the `at`-th pass (0: the spill, 1: Newton 1, ...)."""

    def __init__(self, at: int, killer, **kw):
        super().__init__(**kw)
        self.at, self.killer, self.calls = at, killer, 0

    def map(self, fn, items, nodes=None, fold=None):
        if self.calls == self.at:
            items = [(functools.partial(self.killer, fn), items[0])] + [(fn, a) for a in items[1:]]
            fn = _apply
        else:
            items = [(fn, a) for a in items]
            fn = _apply
        self.calls += 1
        return super().map(fn, items, nodes, fold)


def _apply(fn, args):
    return fn(*args)


@pytest.fixture
def by_value():
    from ray import cloudpickle  # Ray's own copy pickles the tasks

    import test_distributed_fit as me

    cloudpickle.register_pickle_by_value(me)  # workers cannot import the tests package
    yield
    cloudpickle.unregister_pickle_by_value(me)


def test_worker_killed_mid_fit_is_retried(cluster, by_value, fleet, in_memory, tmp_path):
    killer = functools.partial(_die_first, str(tmp_path / "killed"))
    with KillingEngine(2, killer, max_retries=2) as engine:
        ours = run_fit(fleet, BATCH, engine=engine)
    assert (tmp_path / "killed").exists()  # it did die once
    check_same_fit(ours, in_memory)


def test_worker_killed_past_its_retries_fails_cleanly(cluster, by_value, fleet, tmp_path):
    with KillingEngine(1, _die_always, max_retries=1) as engine, pytest.raises(AvkitError) as e:
        run_fit(fleet, FitConfig(mode="batch", engine="ray", scratch=str(tmp_path)), engine=engine)
    msg = str(e.value)
    assert "\n" not in msg and str(fleet[0]) in msg and "after 1 retries" in msg
    assert os.listdir(tmp_path) == []  # spills removed


# ---- the online replay per replica (fit/replay.py `online_replicas`) ----

ONLINE = FitConfig(mode="online", replicas="independent")


@pytest.fixture(scope="module")
def replicas_local(fleet):
    return run_fit(fleet, ONLINE)  # each replica on its own estimator, on this process's threads


def test_replica_replay_on_ray_equals_the_single_process_replay(cluster, fleet, replicas_local):
    ours = run_fit(fleet, FitConfig(mode="online", engine="ray", replicas="independent"))
    a, b = ours.coefficients, replicas_local.coefficients  # bit-identical: the same task function
    assert a["slope"] == b["slope"] and a["intercepts"] == b["intercepts"] and _settled(a) == _settled(b)
    assert ours.scores == replicas_local.scores
    assert ours.trajectory.equals(replicas_local.trajectory)


def test_worker_killed_mid_replay_is_retried(cluster, by_value, fleet, tmp_path):
    from avkit.estimators import make_estimator
    from avkit.fit.data import load_fit_data
    from avkit.fit.replay import online_replicas

    data = load_fit_data(fleet)
    starts, feats = [make_estimator("online_logistic", k=data.k)], [data.features["logit_qmax"]]
    want = online_replicas(starts, feats, data, LocalEngine(2))
    killer = functools.partial(_die_first, str(tmp_path / "killed"))
    with KillingEngine(0, killer, max_retries=2) as engine:
        got = online_replicas(starts, feats, data, engine)
    assert (tmp_path / "killed").exists()  # it did die once
    (est_w, p_w, rows_w), (est_g, p_g, rows_g) = want[0], got[0]
    np.testing.assert_array_equal(p_g, p_w)
    assert rows_g == rows_w and est_g.state_dict() == est_w.state_dict()
