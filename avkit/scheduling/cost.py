"""The step cost model (docs/budget.md "Cost tables"): what one engine step costs by its shape. The ONE pricing
of a step: budget, early stop, draft gate, catch-up, the HVD joint plan (hvd/cost.py `in_forwards`), `tune`'s arms and the
simulator all price through `CostTable`. Its fields are the JSON fields of a cost file (ms unless said; every
grid strictly increasing from >= 0, every curve non-decreasing, piecewise linear between its points and the
last segment's slope beyond: `interp_curve`, the one interpolation in avkit).

Model, for n requests, m of them drafting k each (m = n unless a cache drafts the others), T target tokens,
C context tokens in the step (None: what the curves hold), l cache lookups:
  step_ms(n, k, T, C, m, l) = passes(k) draft_ms(m) + [k > 0] draft_fixed_ms(m) + context_ms(n) + request_ms(n)
                        + kv_ms_per_token (C - held_context(n, T)) + verify_ms(T) + lookup_ms l
                        (times the shape's factor in shape_scale, where it holds one)
  passes(k)       k (autoregressive) or [k > 0] (parallel)
  held_context    n context_len with a context curve, else the profile's verify layout, ceil(T / (meta.k + 1))
                  requests at context_len
  catch_up(lag)   a drafter lacking `lag` tokens prefills all but the last (drafters/draft_model.py):
                  prefill_ms(lag - 1), below the prefill grid a draft pass over those rows; lag <= FREE_LAG is free
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from numbers import Real
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from avkit.config import PROFILE_CONTEXT_ENV, SHIPPED_COST, default_cost_spec, shipped_file
from avkit.errors import ConfigError
from avkit.jsonsafe import read_json
from avkit.scheduling.roofline import roofline_curves
from avkit.staged import StagedOutputs
from avkit.validate import check_range

set_ = object.__setattr__  # a frozen table normalizes its own fields once, in __post_init__

DRAFTER_KINDS = ("autoregressive", "parallel")
FREE_LAG = 2  # tokens the first draft pass feeds itself (the draft x_K and the bonus token); more are prefilled
CURVES = ("verify_ms", "draft_ms", "context_ms", "draft_fixed_ms", "prefill_ms", "request_ms")  # ms curves, by field
BANDS_PER_OCTAVE = 2  # context bands per doubling of the cached tokens per request
GRID_OF = {"verify_ms": "verify_tokens", "draft_ms": "draft_requests", "context_ms": "draft_requests",
           "draft_fixed_ms": "draft_requests", "prefill_ms": "prefill_tokens", "request_ms": "draft_requests"}


def interp_curve(x, xs, ys, beyond: str = "slope") -> np.ndarray:
    """Piecewise linear in the grid `xs` -> `ys`; the first value below it; beyond it the last segment's
    slope (`beyond="slope"`, cost curves) or the last value (`"flat"`, e.g. a tuner's per-batch savings).

    >>> interp_curve([0, 1.5, 4], [1, 2, 3], [10.0, 20.0, 25.0]).tolist()
    [10.0, 15.0, 30.0]
    """
    x, xs, ys = (np.asarray(v, dtype=np.float64) for v in (x, xs, ys))
    y = np.interp(x, xs, ys)
    if beyond == "slope" and xs.size > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
    return y


def isotonic(y, weight=None) -> np.ndarray:
    """Pool adjacent violators: the non-decreasing sequence closest to `y` in (weighted) least squares.
    A spike is averaged with its neighbours instead of carried upward (a running maximum lifts every
    point after it). One loop over curve points (tens), never over drafts.

    >>> isotonic([1.0, 3.0, 2.0, 4.0]).tolist()
    [1.0, 2.5, 2.5, 4.0]
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    w = np.ones_like(y) if weight is None else np.asarray(weight, dtype=np.float64).reshape(-1)
    means, weights, sizes = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist()):
        means.append(yi), weights.append(wi), sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:  # pool the last two blocks
            m, ww, s = means.pop(), weights.pop(), sizes.pop()
            means[-1] = (means[-1] * weights[-1] + m * ww) / (weights[-1] + ww)
            weights[-1] += ww
            sizes[-1] += s
    return np.repeat(np.asarray(means, dtype=np.float64), sizes)


def context_band(context_tokens, num_requests) -> np.ndarray:
    """The context band of a step: log2 of its cached tokens per request, in half-octaves (rounded)."""
    per_request = np.asarray(context_tokens, dtype=np.float64) / np.maximum(np.asarray(num_requests, np.float64), 1.0)
    return np.rint(BANDS_PER_OCTAVE * np.log2(1.0 + per_request))


def shape_keys(num_requests, passes, tokens, context_tokens, draft_rows, lookups) -> np.ndarray:
    """[..., 6] the key of each step's shape in `shape_scale` (module note; draft rows 0 without passes)."""
    n, passes, tokens, context, rows, lookups = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (num_requests, passes, tokens, context_tokens, draft_rows, lookups)))
    return np.stack([n, np.where(passes > 0, rows, 0.0), passes, tokens, lookups, context_band(context, n)], -1)


def _rows(keys: np.ndarray) -> np.ndarray:
    """[..., 6] float keys -> [...] one opaque value each, equal iff the six numbers are (+0.0: no -0.0)."""
    keys = np.ascontiguousarray(keys + 0.0, dtype=np.float64)
    return keys.view(np.dtype((np.void, 8 * keys.shape[-1])))[..., 0]


def number_list(where: str, key: str, values, *, integer: bool = False, empty: bool = False) -> tuple:
    """A list field of finite numbers (integers where asked) as a tuple; the error names file, field and index."""
    if not isinstance(values, (list, tuple, np.ndarray)) or (not len(values) and not empty):
        raise ConfigError(f"{where}: field {key!r} must be a non-empty list of numbers, got {values!r}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or (integer and v != int(v)):
            raise ConfigError(f"{where}: field {key!r}[{i}] must be {'an integer' if integer else 'a finite number'}, "
                              f"got {v!r}")
    return tuple(int(v) for v in values) if integer else tuple(float(v) for v in values)


def _check_curve(where: str, label: str, x: tuple, y: tuple):
    if len(x) == 0 or len(x) != len(y):
        raise ConfigError(f"{where}: {label} needs equal, non-empty x and ms lists, got {len(x)} and {len(y)}")
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if y.min() < 0:
        raise ConfigError(f"{where}: {label} ms must be finite and >= 0, got {y.tolist()}")
    if x[0] < 0 or np.any(np.diff(x) <= 0):
        raise ConfigError(f"{where}: {label} x must be >= 0 and strictly increasing, got {x.tolist()}")
    if np.any(np.diff(y) < -1e-9 * max(float(y.max()), 1.0)):
        i = int(np.flatnonzero(np.diff(y) < 0)[0])
        raise ConfigError(f"{where}: {label} must be non-decreasing: {y[i]} ms at {x[i]:g} > "
                          f"{y[i + 1]} ms at {x[i + 1]:g} (use isotonic)")


@dataclass(frozen=True)
class CostTable:
    verify_tokens: tuple[int, ...]  # [P] target tokens per step (grid)
    verify_ms: tuple[float, ...]  # [P] one target forward over T tokens (with the profiled layout's KV reads)
    draft_requests: tuple[int, ...]  # [Q] requests per draft forward (grid)
    draft_ms: tuple[float, ...]  # [Q] one draft forward, one token per request, with the logits work
    context_ms: tuple[float, ...] = ()  # [Q] target KV reads by requests (empty = 0: profiled tables)
    drafter: str = "autoregressive"  # k draft passes for k drafts, or "parallel": one
    meta: dict = field(default_factory=dict)  # device, target, draft, source (profile|roofline|learned|vllm), ...
    draft_fixed_ms: tuple[float, ...] = ()  # [Q] drafting paid once per step whatever k (vLLM's proposer; empty = 0)
    prefill_tokens: tuple[int, ...] = ()  # [U] tokens of one request the drafter prefills (grid; empty: not profiled)
    prefill_ms: tuple[float, ...] = ()  # [U] the price of a catch-up
    context_len: int = 0  # KV tokens per request the curves hold (older files: meta.context_len)
    kv_ms_per_token: float = 0.0  # ms per cached context token of a step beyond `held_context`
    lookup_ms: float = 0.0  # ms per request a cache drafter looks up (learned live)
    noise: dict = field(default_factory=dict)  # curve -> [points] IQR / median of the repeats (profiled tables)
    request_ms: tuple[float, ...] = ()  # [Q] what n requests add beyond one request's, whatever the tokens (empty = 0)
    # [S, 7] (n, m, passes, T, l, band, factor): step_ms of that shape times factor (learn.py; m = 0 without
    # passes, band = context_band(C, n))
    shape_scale: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self):
        """The one validation of a table, built in code or read (`from_json`): lists become tuples of numbers;
        errors name the file (meta.path), the field and the value."""
        where = f"cost table {self.meta.get('path', '')}".rstrip() if isinstance(self.meta, dict) else "cost table"
        for key, kind, name in (("meta", dict, "an object"), ("drafter", str, "a string"), ("noise", dict, "an object")):
            if not isinstance(getattr(self, key), kind):
                raise ConfigError(f"{where}: field {key!r} must be {name}, got {getattr(self, key)!r}")
        for key in ("device", "target", "draft", "source"):
            if key in self.meta and not isinstance(self.meta[key], str):
                raise ConfigError(f"{where}: field 'meta.{key}' must be a string, got {self.meta[key]!r}")
        for key in ("k", "context_len"):
            v = self.meta.get(key)
            if key in self.meta and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{where}: field 'meta.{key}' must be a non-negative integer, got {v!r}")
        for key in ("verify_tokens", "draft_requests", "prefill_tokens", *CURVES):
            set_(self, key, number_list(where, key, getattr(self, key), integer=key.endswith(("_tokens", "_requests")),
                                     empty=key not in ("verify_tokens", "verify_ms", "draft_requests", "draft_ms")))
        for key in ("context_len", "kv_ms_per_token", "lookup_ms"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                    (key == "context_len" and v != int(v)):
                raise ConfigError(f"{where}: field {key!r} must be a non-negative number, got {v!r}")
        set_(self, "context_len", int(self.context_len))
        for ms in CURVES:
            if getattr(self, ms) or (ms == "prefill_ms" and self.prefill_tokens) or ms in ("verify_ms", "draft_ms"):
                _check_curve(where, ms.removesuffix("_ms"), getattr(self, GRID_OF[ms]), getattr(self, ms))
        if self.drafter not in DRAFTER_KINDS:
            raise ConfigError(f"{where}: drafter must be one of {DRAFTER_KINDS}, got {self.drafter!r}")
        if not isinstance(self.shape_scale, (list, tuple)) or not all(isinstance(e, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in e) for e in self.shape_scale):
            raise ConfigError(f"{where}: field 'shape_scale' must be a list of lists of 7 numbers, got "
                              f"{self.shape_scale!r}")
        for i, entry in enumerate(self.shape_scale):
            if len(entry) != 7 or not all(math.isfinite(v) and v >= 0 for v in entry) or entry[-1] <= 0:
                raise ConfigError(f"{where}: field 'shape_scale'[{i}] must be 7 numbers >= 0 (n, m, passes, T, l, "
                                  f"band, factor > 0), got {list(entry)!r}")
        set_(self, "shape_scale", tuple(tuple(float(v) for v in e) for e in self.shape_scale))

    def shape_factor(self, keys: np.ndarray) -> np.ndarray:
        """[..., 6] shape keys (`shape_keys`) -> [...] their factors in shape_scale (1 where it holds none)."""
        if not self.shape_scale:
            return np.ones(keys.shape[:-1])
        entries = np.asarray(self.shape_scale, dtype=np.float64)  # [S, 7]
        order = np.argsort(names := _rows(entries[:, :6]))  # [S] by each key's bytes: one search matches all six
        names, factors, wanted = names[order], entries[order, 6], _rows(keys)
        at = np.searchsorted(names, wanted).clip(max=len(names) - 1)  # [...]
        return np.where(names[at] == wanted, factors[at], 1.0)

    def curve(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(grid, ms) of a curve by its ms field; an empty optional curve reads as zeros on its grid."""
        xs = np.asarray(getattr(self, GRID_OF[name]), dtype=np.float64)
        ys = np.asarray(getattr(self, name), dtype=np.float64)
        return xs, (ys if ys.size else np.zeros_like(xs))

    def _at(self, name: str, x) -> np.ndarray:
        return interp_curve(x, *self.curve(name))

    # ---- lookups (vectorized over numpy arrays) ----
    def verify_cost(self, tokens) -> np.ndarray:
        """[n] target tokens -> [n] ms."""
        return self._at("verify_ms", tokens)

    def draft_pass_cost(self, num_requests) -> np.ndarray:
        """One draft forward of n rows, one token each."""
        return self._at("draft_ms", num_requests)

    def draft_fixed_cost(self, num_requests) -> np.ndarray:
        """What a step's drafting pays once for n drafting requests, beyond its passes (0 unless profiled)."""
        return self._at("draft_fixed_ms", num_requests)

    def passes(self, k) -> np.ndarray:
        """Draft forwards for k drafts: k (autoregressive) or [k > 0] (parallel)."""
        k = np.asarray(k, dtype=np.float64)
        return k if self.drafter == "autoregressive" else (k > 0) * 1.0

    def draft_cost(self, num_requests, k) -> np.ndarray:
        """Drafting k tokens for each of n requests: passes(k) forwards of n rows, plus the fixed part if k > 0."""
        return self.passes(k) * self.draft_pass_cost(num_requests) + \
            (np.asarray(k) > 0) * self.draft_fixed_cost(num_requests)

    def draft_prefill_cost(self, tokens) -> np.ndarray:
        """The drafter prefilling n tokens of one request; a draft pass over n rows where not profiled
        or below the profiled grid (the same forward: n rows of one token)."""
        tokens = np.asarray(tokens, dtype=np.float64)
        if not self.prefill_tokens:
            return self.draft_pass_cost(tokens)
        return np.where(tokens < self.prefill_tokens[0], self.draft_pass_cost(np.maximum(tokens, 1.0)),
                        self._at("prefill_ms", tokens))

    def catch_up_cost(self, lag) -> np.ndarray:
        """[n] ms the drafter spends before drafting rows that lack `lag` [n] tokens (module note)."""
        lag = np.asarray(lag, dtype=np.float64)
        return np.where(lag > FREE_LAG, self.draft_prefill_cost(np.maximum(lag - 1.0, 1.0)), 0.0)

    def held_context(self, num_requests, tokens) -> np.ndarray:
        """KV tokens the curves hold for a step of n requests and T target tokens: n context_len with a
        context curve; else (profiled: the KV reads are in verify_ms) the verify layout's requests at it."""
        n = np.asarray(num_requests, dtype=np.float64)
        if self.context_ms:
            return n * self.context_len
        rows = np.ceil(np.asarray(tokens, dtype=np.float64) / (int(self.meta.get("k", 0)) + 1))
        return np.maximum(rows, 1.0) * self.context_len

    def context_cost(self, num_requests, context_tokens=None, tokens=None) -> np.ndarray:
        """What n requests cost beyond their tokens: request_ms, and context_ms moved by kv_ms_per_token per cached
        token beyond `held_context(n, tokens)` (`context_tokens` None: what the curves hold; `tokens` None: n)."""
        n = np.asarray(num_requests, dtype=np.float64)
        base = self._at("context_ms", n) + self._at("request_ms", n)
        if context_tokens is None or not self.kv_ms_per_token:
            return base
        held = self.held_context(n, n if tokens is None else tokens)
        return base + self.kv_ms_per_token * (np.asarray(context_tokens, dtype=np.float64) - held)

    def step_cost(self, num_requests, k, tokens, context_tokens=None, draft_rows=None, lookups=0) -> np.ndarray:
        """Predicted step time (module note): n requests, `draft_rows` of them (None: all) drafting k tokens
        each, T target tokens verified, `lookups` requests a cache drafter consulted."""
        rows = num_requests if draft_rows is None else draft_rows
        ms = self.draft_cost(rows, k) + self.context_cost(num_requests, context_tokens, tokens) + \
            self.verify_cost(tokens) + self.lookup_ms * np.asarray(lookups, dtype=np.float64)
        if not self.shape_scale:
            return ms
        context = self.held_context(num_requests, tokens) if context_tokens is None else context_tokens
        return ms * self.shape_factor(shape_keys(num_requests, self.passes(k), tokens, context, rows, lookups))

    # ---- persistence ----
    def to_json(self) -> dict:
        d = asdict(self)
        d["meta"] = {k: v for k, v in self.meta.items() if k != "path"}
        return d

    def save(self, path, outputs: StagedOutputs | None = None) -> Path:
        """Write JSON through a staged output (`outputs`, committed by the caller; else committed here)."""
        with StagedOutputs() if outputs is None else nullcontext(outputs) as out:
            out.file(path).write_text(json.dumps(self.to_json(), indent=1))
        return Path(path).expanduser()

    @classmethod
    def load(cls, path) -> CostTable:
        """Read and validate a cost file (any version of the schema above); errors name the file and field."""
        path = Path(path).expanduser()
        table = cls.from_json(read_json(path, "cost table"), str(path))
        if min(table.verify_ms) <= 0:
            raise ConfigError(f"cost table {path}: field 'verify_ms' must be positive (a target forward costs "
                              f"time), got {list(table.verify_ms)}")
        return table

    @classmethod
    def from_json(cls, d, source: str = "") -> CostTable:
        """A table from its JSON object (`to_json`), older files included (context_len in meta, no noise)."""
        where = f"cost table {source}".rstrip()
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
        missing = [k for k in ("verify_tokens", "verify_ms", "draft_requests", "draft_ms") if k not in d]
        if missing:
            raise ConfigError(f"{where}: missing key {missing[0]!r}")
        meta = d.get("meta", {})
        if source and isinstance(meta, dict):
            meta = {**meta, "path": source}
        fields_ = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if isinstance(meta, dict) and "context_len" not in d:
            fields_["context_len"] = meta.get("context_len", 0)
        return cls(**{**fields_, "meta": meta})


def context_len_from_env(default: int) -> int:
    """KV tokens per request to price or profile at: $AVKIT_PROFILE_CONTEXT_LEN, else `default`."""
    raw = os.environ.get(PROFILE_CONTEXT_ENV)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ConfigError(f"{PROFILE_CONTEXT_ENV} must be an integer, got {raw!r}") from None
    return check_range(PROFILE_CONTEXT_ENV, value, 0)


def resolve_cost(spec: str | CostTable | None) -> CostTable:
    """A CostTable from a table, a JSON path or a roofline spec (`roofline:GPU:TARGET[:DRAFT][:context=N,
    drafter=parallel]`: scheduling/roofline.py's curves, context by default $AVKIT_PROFILE_CONTEXT_LEN, else
    8192); empty: the live default (`default_cost_spec`)."""
    if isinstance(spec, CostTable):
        return spec
    spec = spec or default_cost_spec()
    if spec.startswith("roofline:"):
        return CostTable(**roofline_curves(spec, str(context_len_from_env(8192))))
    if spec == SHIPPED_COST:  # the default: found as the shipped traces are (here, else beside the package)
        return CostTable.load(shipped_file(SHIPPED_COST) or spec)
    return CostTable.load(spec)
