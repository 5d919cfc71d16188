"""`avkit fit --engine ray`: the out-of-core passes of fit/streaming.py as tasks on a Ray cluster.

Each shard is one task per pass (map); the driver sums the O(K) IRLS statistics or the score
sums (reduce) and takes the Newton step, so coefficients equal the single-process fit's and the
scores are those of `metrics/binned.py`. Pass 0 spills a shard's observed slots on the node that
ran it; every later pass over that shard is pinned to the same node (NodeAffinitySchedulingStrategy),
and the spills are removed on every node at the end. Nothing large crosses the object store:
tasks take a shard path or survey and return sums of a few KB (scores: the rank histograms).

Failures:
  a task that raises (a shard that cannot be read, a bad value)  ->  the AvkitError itself, one
       line naming the shard; no output is written (`avkit fit` writes only after the fit)
  a worker process that dies (killed, out of memory)  ->  Ray reruns the task, up to
       `max_retries` times (passes are pure functions of the shard, so a rerun gives the same sums);
       past that, one line naming the shard and the Ray error
A local cluster (no address) starts with `num_cpus` = this machine's cores and an object store
capped at `object_store_mb`; an address (`ray://host:10001`, `host:6379` or `auto`) joins an
existing cluster, whose workers must have avkit installed and see the trace paths (shared storage).
"""

from __future__ import annotations

import copy
import os
import shutil

from avkit.errors import AvkitError, ConfigError


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("--engine ray needs Ray: pip install 'avkit[distributed]'") from None
    return ray


def _call(fn, args):
    """Task body: run `fn(*args)` and say on which node it ran."""
    import ray

    return ray.get_runtime_context().get_node_id(), fn(*args)


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class RayEngine:
    """A pass's map as Ray tasks; `with RayEngine(...)` connects (or starts) and later disconnects."""

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, object_store_mb: int = 512,
                 max_retries: int = 3):
        self.address, self.num_cpus, self.object_store_mb = address, num_cpus, object_store_mb
        self.max_retries = max_retries
        self._started = False

    def __enter__(self) -> RayEngine:
        ray = _ray()
        if not ray.is_initialized():
            kw = {"address": self.address} if self.address else {
                "num_cpus": self.num_cpus or os.cpu_count(), "object_store_memory": self.object_store_mb << 20,
                "include_dashboard": False}
            try:
                ray.init(log_to_driver=False, **kw)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise ConfigError(f"--address {self.address}: cannot connect to a Ray cluster: "
                                  f"{str(e).splitlines()[0]}") from None
            self._started = True
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            _ray().shutdown()

    def map(self, fn, items: list[tuple], nodes: list[str | None] | None = None, fold=None) -> tuple[list, list]:
        """Run `fn(*item)` for every item as a task (item i on node nodes[i] when given);
        -> (results, node ids), in item order; with `fold`, the results folded in item order as they
        are fetched (the driver holds one at a time)."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(max_retries=self.max_retries)(_call)
        refs = []
        for i, args in enumerate(items):
            opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i], soft=False)} \
                if nodes and nodes[i] else {}
            refs.append(task.options(**opts).remote(fn, args))
        out, acc = [], None
        for i, args in enumerate(items):
            try:
                node, result = ray.get(refs[i])
                if fold is not None:  # arrays from the object store are read-only views: copy before adding
                    acc = copy.deepcopy(result) if acc is None else fold(acc, copy.deepcopy(result))
                    result, refs[i] = None, None  # the store may free it now
                out.append((node, result))
            except ray.exceptions.RayTaskError as e:
                for r in refs:
                    if r is not None:
                        ray.cancel(r)
                cause = getattr(e, "cause", None)
                if isinstance(cause, AvkitError):
                    raise type(cause)(str(cause).splitlines()[0]) from None
                raise AvkitError(f"ray: task on shard {_shard(args)} failed: {type(cause).__name__}: "
                                 f"{str(cause).splitlines()[0] if cause else e}") from None
            except ray.exceptions.RayError as e:
                for r in refs:
                    if r is not None:
                        ray.cancel(r)
                raise AvkitError(f"ray: task on shard {_shard(args)} failed after {self.max_retries} "
                                 f"retries: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if fold is not None:
            return acc, [n for n, _ in out]
        # arrays from the object store are read-only views: copy what the driver will add into
        return [copy.deepcopy(r) for _, r in out], [n for n, _ in out]

    def cleanup(self, scratch: str, nodes) -> None:
        """Remove the spill directory on every node that wrote to it (and here)."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if ray.is_initialized():
            task = ray.remote(max_retries=0)(_remove)
            refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=True)).remote(scratch)
                    for n in sorted(set(nodes or [])) if n]
            try:
                ray.get(refs, timeout=60)
            except ray.exceptions.RayError:
                pass  # best effort: a dead node's scratch goes with it
        _remove(scratch)


def _shard(args) -> str:
    """The shard a task's arguments name: a survey's path, or a path string."""
    if hasattr(args, "path"):
        return str(args.path)
    if isinstance(args, str):
        return args
    if isinstance(args, tuple):
        for a in args:
            if (found := _shard(a)) != "?":
                return found
    return "?"


def fit_ray(paths, fit, est_cfg=None, progress=None, **engine_kw):
    """`fit_streaming` on a Ray cluster (`fit.address`, or a local one)."""
    from avkit.fit.streaming import fit_streaming

    with RayEngine(fit.address, object_store_mb=min(1024, max(128, fit.memory_budget_mb // 2)),
                   **engine_kw) as engine:
        return fit_streaming(paths, fit, est_cfg, progress, engine=engine)


__all__ = ["RayEngine", "fit_ray"]
