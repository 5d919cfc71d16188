"""Step cost tables: what one engine step costs as a function of its shape (docs/budget.md).

Glossary:
  verify_ms(T)    target forward over T tokens at the table's KV context (weights + compute)
  draft_ms(n)     one draft forward, one token for each of n requests
  context_ms(n)   target KV-cache reads that scale with requests, not tokens (0 in profiled tables,
                  whose verify_ms already includes them for the profiling layout)
  draft passes    forwards the drafter runs for k drafts: k (autoregressive) or 1 (parallel, DSpark-like)
  step_ms(n, k, T) = passes(k) * draft_ms(n) + context_ms(n) + verify_ms(T)

A table is a few measured points per curve, interpolated linearly (extrapolated with the last
segment's slope), non-decreasing by construction. Tables come from `avkit profile` (measured) or from
`avkit.scheduling.roofline` (what-if for a named accelerator and model size); both save as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from avkit.errors import ConfigError

DRAFTER_KINDS = ("autoregressive", "parallel")


def _check_curve(label: str, xs: tuple, ys: tuple, source: str):
    where = f"cost table {source}: " if source else "cost table: "
    if len(xs) == 0 or len(xs) != len(ys):
        raise ConfigError(f"{where}{label} needs equal, non-empty x and ms lists, got {len(xs)} and {len(ys)}")
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if not np.all(np.isfinite(y)) or y.min() < 0:
        raise ConfigError(f"{where}{label} ms must be finite and >= 0, got {y.tolist()}")
    if x[0] < 0 or np.any(np.diff(x) <= 0):
        raise ConfigError(f"{where}{label} x must be >= 0 and strictly increasing, got {x.tolist()}")
    if np.any(np.diff(y) < 0):
        i = int(np.flatnonzero(np.diff(y) < 0)[0])
        raise ConfigError(f"{where}{label} must be non-decreasing: {y[i]} ms at {x[i]:g} > "
                          f"{y[i + 1]} ms at {x[i + 1]:g} (use make_monotone)")


def make_monotone(ms) -> list[float]:
    """Running maximum: measured noise must never make a bigger step look cheaper."""
    return np.maximum.accumulate(np.asarray(ms, dtype=np.float64)).tolist()


def _interp(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear in the grid, last-segment slope beyond it, first value below it."""
    y = np.interp(x, xs, ys)
    if xs.size > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
    return y


@dataclass(frozen=True)
class CostTable:
    verify_tokens: tuple[int, ...]  # [P] target tokens per step (grid)
    verify_ms: tuple[float, ...]  # [P]
    draft_requests: tuple[int, ...]  # [Q] requests per draft forward (grid)
    draft_ms: tuple[float, ...]  # [Q] one draft forward
    context_ms: tuple[float, ...] = ()  # [Q] target KV reads by requests (empty = 0)
    drafter: str = "autoregressive"
    meta: dict = field(default_factory=dict)  # device, target, draft, context_len, source, ...

    def __post_init__(self):
        src = str(self.meta.get("path", ""))
        _check_curve("verify", self.verify_tokens, self.verify_ms, src)
        _check_curve("draft", self.draft_requests, self.draft_ms, src)
        if self.context_ms:
            _check_curve("context", self.draft_requests, self.context_ms, src)
        if self.drafter not in DRAFTER_KINDS:
            raise ConfigError(f"cost table {src}: drafter must be one of {DRAFTER_KINDS}, got {self.drafter!r}")
        object.__setattr__(self, "_v", (np.asarray(self.verify_tokens, float), np.asarray(self.verify_ms)))
        object.__setattr__(self, "_d", (np.asarray(self.draft_requests, float), np.asarray(self.draft_ms)))
        ctx = self.context_ms or (0.0,) * len(self.draft_ms)
        object.__setattr__(self, "_c", (np.asarray(self.draft_requests, float), np.asarray(ctx)))

    # ---- lookups (vectorized over numpy arrays) ----
    def verify_cost(self, tokens) -> np.ndarray:
        """[n] target tokens -> [n] ms."""
        return _interp(np.asarray(tokens, dtype=np.float64), *self._v)

    def draft_passes(self, k) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        return k if self.drafter == "autoregressive" else (k > 0).astype(np.float64)

    def draft_cost(self, num_requests, k) -> np.ndarray:
        """Drafting k tokens for each of n requests: passes(k) forwards of n rows."""
        return self.draft_passes(k) * _interp(np.asarray(num_requests, dtype=np.float64), *self._d)

    def context_cost(self, num_requests) -> np.ndarray:
        """The target's KV reads for n requests (0 for profiled tables)."""
        return _interp(np.asarray(num_requests, dtype=np.float64), *self._c)

    def fixed_cost(self, num_requests, k) -> np.ndarray:
        """Cost that does not depend on how many drafts are verified: drafting k + KV reads."""
        return self.draft_cost(num_requests, k) + self.context_cost(num_requests)

    def step_cost(self, num_requests, k, tokens) -> np.ndarray:
        """Predicted step time: n requests drafting k tokens each, T target tokens verified."""
        return self.fixed_cost(num_requests, k) + self.verify_cost(tokens)

    # ---- persistence ----
    def to_json(self) -> dict:
        d = asdict(self)
        d["meta"] = {k: v for k, v in self.meta.items() if k != "path"}
        return d

    def save(self, path) -> Path:
        """Write JSON atomically (temp file in the same folder, then rename)."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path) -> CostTable:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"cost table: no such file: {path}")
        try:
            d = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"cost table {path}: not valid JSON ({e})") from None
        need = ("verify_tokens", "verify_ms", "draft_requests", "draft_ms")
        missing = [k for k in need if k not in d]
        if missing:
            raise ConfigError(f"cost table {path}: missing key {missing[0]!r}")
        try:
            return cls(
                verify_tokens=tuple(int(x) for x in d["verify_tokens"]),
                verify_ms=tuple(float(x) for x in d["verify_ms"]),
                draft_requests=tuple(int(x) for x in d["draft_requests"]),
                draft_ms=tuple(float(x) for x in d["draft_ms"]),
                context_ms=tuple(float(x) for x in d.get("context_ms", ())),
                drafter=str(d.get("drafter", "autoregressive")),
                meta={**dict(d.get("meta", {})), "path": str(path)},
            )
        except (TypeError, ValueError) as e:
            raise ConfigError(f"cost table {path}: non-numeric entry ({e})") from None


def resolve_cost(spec: str | CostTable | None) -> CostTable:
    """A CostTable from a table, a JSON path, or `roofline:GPU:TARGET[:DRAFT][:key=value,...]`.

    Empty/None: the profiled table at DEFAULT_COST_PATH if it exists, else the CPU roofline of the
    default model pair.
    """
    from avkit.config import DEFAULT_COST_PATH
    from avkit.scheduling.roofline import parse_roofline_spec

    if isinstance(spec, CostTable):
        return spec
    if not spec:
        default = Path(DEFAULT_COST_PATH).expanduser()
        return CostTable.load(default) if default.is_file() else parse_roofline_spec("roofline:cpu:1.5b")
    if spec.startswith("roofline:"):
        return parse_roofline_spec(spec)
    return CostTable.load(spec)
