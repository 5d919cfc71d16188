"""Where a fit's map runs: `LocalEngine` on this machine's threads, `RayEngine` as tasks on a Ray cluster.

Both have `map(fn, items, nodes=None, fold=None)` -> (results, or their fold in item order; the node
each ran on) and `cleanup(scratch, nodes)`. On Ray (docs/fleet.md): one task per item, pinned to the
node that spilled its shard; a task that raises fails the fit in one line naming the shard, a dead
worker's task is rerun up to `max_retries` times (a pass is a pure function of its shard).
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from avkit.config import FitConfig
from avkit.errors import AvkitError, ConfigError, first_line


class LocalEngine:
    """A pass's map on `workers` threads (numpy and polars release the GIL), alive as long as the engine (a
    fresh thread pays ~70 ms per 1M rows faulting in a new malloc arena, every pass over again)."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers)

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown()

    def map(self, fn, items: list[tuple], nodes=None, fold=None) -> tuple[list, list]:
        """With `fold` the total and at most `workers` results exist at once (a score pass's sums are ~37 MB
        per feature and shard)."""
        where = [None] * len(items)
        if fold is None:
            return list(self.pool.map(lambda args: fn(*args), items)), where
        todo, acc = iter(items), None
        pending = deque(self.pool.submit(fn, *args) for args in itertools.islice(todo, self.workers))
        while pending:
            result = pending.popleft().result()
            acc = result if acc is None else fold(acc, result)
            del result  # (the first result is the total itself)
            if (args := next(todo, None)) is not None:
                pending.append(self.pool.submit(fn, *args))
        return acc, where

    def cleanup(self, scratch: str, nodes) -> None:
        _remove(scratch)


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _ray():
    try:
        import ray  # optional: ray
    except ModuleNotFoundError:
        raise ConfigError("--engine ray needs Ray: pip install 'avkit[distributed]'") from None
    return ray


def _call(fn, args):
    """Task body: run `fn(*args)` and say on which node it ran."""
    import ray  # optional: ray (runs on a Ray worker)

    return ray.get_runtime_context().get_node_id(), fn(*args)


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
                                  f"{first_line(e)}") from None
            self._started = True
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            _ray().shutdown()

    def map(self, fn, items: list[tuple], nodes: list[str | None] | None = None, fold=None) -> tuple[list, list]:
        """One task per item (item i on node nodes[i] when given); with `fold` the driver holds one result."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional: ray

        task = ray.remote(max_retries=self.max_retries)(_call)
        refs = [task.options(**({"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i], soft=False)}
                                if nodes and nodes[i] else {})).remote(fn, args) for i, args in enumerate(items)]
        results, where, acc = [], [], None
        for i, args in enumerate(items):  # arrays from the object store are read-only views: copied
            try:
                node, result = ray.get(refs[i])
            except ray.exceptions.RayError as e:
                for r in filter(None, refs):
                    ray.cancel(r)
                cause = getattr(e, "cause", None) if isinstance(e, ray.exceptions.RayTaskError) else e
                if isinstance(cause, AvkitError):
                    raise type(cause)(first_line(cause)) from None
                retried = "" if isinstance(e, ray.exceptions.RayTaskError) else f" after {self.max_retries} retries"
                raise AvkitError(f"ray: task on shard {_shard(args)} failed{retried}: {type(cause).__name__}: "
                                 f"{first_line(cause or e)}") from None
            result = copy.deepcopy(result)
            where.append(node)
            if fold is None:
                results.append(result)
            else:
                acc = result if acc is None else fold(acc, result)
                result = refs[i] = None  # the store may free it now
        return (results if fold is None else acc), where

    def cleanup(self, scratch: str, nodes) -> None:
        """Remove the spill directory on every node that wrote to it (and here)."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional: ray

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
    """The shard a task's arguments name: a survey's path or a path string, searched depth first."""
    if isinstance(args, str) or hasattr(args, "path"):
        return str(getattr(args, "path", args))
    return next((f for f in map(_shard, args) if f != "?"), "?") if isinstance(args, tuple) else "?"


def open_engine(fit: FitConfig) -> LocalEngine | RayEngine:
    """The engine `fit.engine` names (`with` it): a Ray cluster for "ray" (`fit.address`, or a local one whose
    object store takes half the memory budget, 128 MB to 1 GB), else `fit.workers` local threads."""
    if fit.engine != "ray":
        return LocalEngine(fit.workers)
    return RayEngine(fit.address, object_store_mb=min(1024, max(128, fit.memory_budget // 2)))
