"""Step cost tables: what one engine step costs as a function of its shape (docs/budget.md).

Glossary:
  verify_ms(T)    target forward over T tokens at the table's KV context (weights + compute)
  draft_ms(n)     one draft forward, one token for each of n requests
  draft_fixed_ms(n)  drafting a step pays once when n requests draft, whatever k: vLLM's draft_model
                  proposer runs its first pass over the tokens verified last step (up to k + 1 per
                  request) and prepares its inputs (0 in native tables: avkit's drafter feeds 1-2 tokens)
  context_ms(n)   target KV-cache reads that scale with requests, not tokens (0 in profiled tables,
                  whose verify_ms already includes them for the profiling layout)
  prefill_ms(n)   the drafter prefilling n tokens of one request (a new prompt, or what it missed while
                  its request did not draft): the price of a catch-up (scheduling/catch_up.py). Profiled
                  tables measure it; where it is absent it is priced as a draft pass over n rows, an upper
                  bound (each row pays its own KV reads and one LM head)
  draft passes    forwards the drafter runs for k drafts: k (autoregressive) or 1 (parallel, DSpark-like)
  step_ms(n, k, T) = passes(k) * draft_ms(n) + [k > 0] draft_fixed_ms(n) + context_ms(n) + verify_ms(T)

A table is a few measured points per curve, interpolated linearly (extrapolated with the last
segment's slope), non-decreasing by construction. Tables come from `avkit profile` (measured) or from
`avkit.scheduling.roofline` (what-if for a named accelerator and model size); both save as JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from avkit.curves import interp_curve
from avkit.errors import ConfigError
from avkit.staged import StagedOutputs

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


@dataclass(frozen=True)
class CostTable:
    verify_tokens: tuple[int, ...]  # [P] target tokens per step (grid)
    verify_ms: tuple[float, ...]  # [P]
    draft_requests: tuple[int, ...]  # [Q] requests per draft forward (grid)
    draft_ms: tuple[float, ...]  # [Q] one draft forward
    context_ms: tuple[float, ...] = ()  # [Q] target KV reads by requests (empty = 0)
    drafter: str = "autoregressive"
    meta: dict = field(default_factory=dict)  # device, target, draft, context_len, source, ...
    draft_fixed_ms: tuple[float, ...] = ()  # [Q] drafting paid once per step by requests (empty = 0)
    prefill_tokens: tuple[int, ...] = ()  # [U] tokens of one request the drafter prefills (grid; empty: not profiled)
    prefill_ms: tuple[float, ...] = ()  # [U]

    def __post_init__(self):
        src = str(self.meta.get("path", ""))
        _check_curve("verify", self.verify_tokens, self.verify_ms, src)
        _check_curve("draft", self.draft_requests, self.draft_ms, src)
        if self.context_ms:
            _check_curve("context", self.draft_requests, self.context_ms, src)
        if self.draft_fixed_ms:
            _check_curve("draft_fixed", self.draft_requests, self.draft_fixed_ms, src)
        if self.prefill_tokens or self.prefill_ms:
            _check_curve("prefill", self.prefill_tokens, self.prefill_ms, src)
        if self.drafter not in DRAFTER_KINDS:
            raise ConfigError(f"cost table {src}: drafter must be one of {DRAFTER_KINDS}, got {self.drafter!r}")
        object.__setattr__(self, "_v", (np.asarray(self.verify_tokens, float), np.asarray(self.verify_ms)))
        object.__setattr__(self, "_d", (np.asarray(self.draft_requests, float), np.asarray(self.draft_ms)))
        ctx = self.context_ms or (0.0,) * len(self.draft_ms)
        object.__setattr__(self, "_c", (np.asarray(self.draft_requests, float), np.asarray(ctx)))
        fixed = self.draft_fixed_ms or (0.0,) * len(self.draft_ms)
        object.__setattr__(self, "_f", (np.asarray(self.draft_requests, float), np.asarray(fixed)))
        object.__setattr__(self, "_p", (np.asarray(self.prefill_tokens, float), np.asarray(self.prefill_ms, float)))

    # ---- lookups (vectorized over numpy arrays) ----
    def verify_cost(self, tokens) -> np.ndarray:
        """[n] target tokens -> [n] ms."""
        return interp_curve(np.asarray(tokens, dtype=np.float64), *self._v)

    def draft_passes(self, k) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        return k if self.drafter == "autoregressive" else (k > 0).astype(np.float64)

    def draft_pass_cost(self, num_requests) -> np.ndarray:
        """One draft forward of n rows, one token each."""
        return interp_curve(np.asarray(num_requests, dtype=np.float64), *self._d)

    def draft_fixed_cost(self, num_requests) -> np.ndarray:
        """What a step's drafting pays once for n drafting requests, beyond its passes (0 unless profiled)."""
        return interp_curve(np.asarray(num_requests, dtype=np.float64), *self._f)

    def draft_cost(self, num_requests, k) -> np.ndarray:
        """Drafting k tokens for each of n requests: passes(k) forwards of n rows, plus the fixed part if k > 0."""
        k = np.asarray(k, dtype=np.float64)
        return self.draft_passes(k) * self.draft_pass_cost(num_requests) + \
            (k > 0) * self.draft_fixed_cost(num_requests)

    def draft_prefill_cost(self, tokens) -> np.ndarray:
        """The drafter prefilling n tokens of one request; a draft pass over n rows where not profiled."""
        if not self.prefill_tokens:
            return self.draft_pass_cost(tokens)
        return interp_curve(np.asarray(tokens, dtype=np.float64), *self._p)

    def context_cost(self, num_requests) -> np.ndarray:
        """The target's KV reads for n requests (0 for profiled tables)."""
        return interp_curve(np.asarray(num_requests, dtype=np.float64), *self._c)

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

    def save(self, path, outputs: StagedOutputs | None = None) -> Path:
        """Write JSON through a staged output (`outputs`, committed by the caller; else committed here)."""
        if outputs is None:
            with StagedOutputs() as own:
                return self.save(path, own)
        outputs.file(path).write_text(json.dumps(self.to_json(), indent=1))
        return Path(path).expanduser()

    @classmethod
    def load(cls, path) -> CostTable:
        """Read and validate a cost table JSON; every error names the file and the field."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"cost table: no such file: {path}")
        try:
            d = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
            raise ConfigError(f"cost table {path}: not valid JSON ({_one_line(e)})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"cost table {path}: expected a JSON object, got {type(d).__name__}")
        need = ("verify_tokens", "verify_ms", "draft_requests", "draft_ms")
        missing = [k for k in need if k not in d]
        if missing:
            raise ConfigError(f"cost table {path}: missing key {missing[0]!r}")
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise ConfigError(f"cost table {path}: field 'meta' must be an object, got {meta!r}")
        _check_meta(path, meta)
        drafter = d.get("drafter", "autoregressive")
        if not isinstance(drafter, str):
            raise ConfigError(f"cost table {path}: field 'drafter' must be a string, got {drafter!r}")
        table = cls(
            verify_tokens=_numbers(path, d, "verify_tokens", integer=True),
            verify_ms=_numbers(path, d, "verify_ms"),
            draft_requests=_numbers(path, d, "draft_requests", integer=True),
            draft_ms=_numbers(path, d, "draft_ms"),
            context_ms=_numbers(path, d, "context_ms", empty=True) if "context_ms" in d else (),
            drafter=drafter, meta={**meta, "path": str(path)},
            draft_fixed_ms=_numbers(path, d, "draft_fixed_ms", empty=True) if "draft_fixed_ms" in d else (),
            prefill_tokens=_numbers(path, d, "prefill_tokens", integer=True, empty=True) if "prefill_tokens" in d
            else (), prefill_ms=_numbers(path, d, "prefill_ms", empty=True) if "prefill_ms" in d else ())
        if min(table.verify_ms) <= 0:
            raise ConfigError(f"cost table {path}: field 'verify_ms' must be positive (a target forward costs "
                              f"time), got {list(table.verify_ms)}")
        return table


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _numbers(path: Path, d: dict, key: str, *, integer: bool = False, empty: bool = False) -> tuple:
    """A list field of finite numbers (integers where asked); the error names file, field and index."""
    values = d[key]
    if not isinstance(values, list) or (not values and not empty):
        raise ConfigError(f"cost table {path}: field {key!r} must be a non-empty list of numbers, got {values!r}")
    for i, v in enumerate(values):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (integer and v != int(v)):
            kind = "an integer" if integer else "a finite number"
            raise ConfigError(f"cost table {path}: field {key!r}[{i}] must be {kind}, got {v!r}")
    return tuple(int(v) for v in values) if integer else tuple(float(v) for v in values)


def _check_meta(path: Path, meta: dict) -> None:
    """Model ids are strings and K / context a non-negative integer, where the table states them."""
    for key in ("device", "target", "draft", "source"):
        if key in meta and not isinstance(meta[key], str):
            raise ConfigError(f"cost table {path}: field 'meta.{key}' must be a string, got {meta[key]!r}")
    for key in ("k", "context_len"):
        v = meta.get(key)
        if key in meta and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"cost table {path}: field 'meta.{key}' must be a non-negative integer, got {v!r}")


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
