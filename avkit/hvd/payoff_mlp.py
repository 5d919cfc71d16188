"""Payoff predictor for Hybrid Verified Decoding: a small MLP estimating a cache draft's accepted
length from runtime features before it is verified (HVD paper, seed 003 in docs/seeds.md; docs/hvd.md).

Glossary:
  payoff      y, the cache draft's accepted length under greedy verification (0..draft_len)
  mean head   one output, trained with MSE on y: g(phi) ~ E[y | phi]
  survival    K outputs h_j; S_j = P(y >= j) = prod_{i<=j} sigmoid(h_i) (non-increasing by
              construction), trained with binary cross-entropy on 1[y >= j] for j <= draft_len
              (longer positions cannot be accepted, so they carry no label); its expected payoff
              is sum_{j <= draft_len} S_j. The survival curve lets cache and model drafts compete
              for one verification budget (docs/budget.md).
  standardize features are centred and scaled with training-split statistics, stored with the weights
Training is seeded and reproducible: the initial weights and the batch order come from private
generators, so global torch RNG state neither affects nor is affected by `fit`.
"""

from __future__ import annotations

import contextlib
import copy
from itertools import pairwise
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from avkit.config import PayoffConfig
from avkit.errors import ConfigError, DataError
from avkit.staged import staged_file

HEADS = ("mean", "survival")


def _log_survival(out: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(nn.functional.logsigmoid(out), dim=1)  # [N, K] log P(y >= j), j = 1..K


@contextlib.contextmanager
def _one_thread():
    """A 64-wide MLP is far too small to split across threads; on a busy machine the thread pool costs
    ~25x (measured 75 ms vs 3 ms per batch). Restores the caller's setting."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class PayoffMLP:
    """Regress the accepted length of a cache draft.

    >>> x = np.random.default_rng(0).normal(size=(256, 2)).astype(np.float32)
    >>> x[:, 1] = 4  # the `draft_len` column
    >>> m = PayoffMLP(("a", "draft_len"), k=4, config=PayoffConfig(epochs=2)).fit(x, 2 + x[:, 0])
    >>> m.predict(x).shape
    (256,)
    """

    def __init__(self, feature_names: tuple[str, ...], k: int, config: PayoffConfig = PayoffConfig(),
                 head: str = "mean"):
        if head not in HEADS:
            raise ConfigError(f"payoff head must be one of {HEADS}, got {head!r}")
        if "draft_len" not in feature_names:
            raise ConfigError(f"payoff features must include 'draft_len', got {list(feature_names)}")
        self.feature_names, self.k, self.config, self.head = tuple(feature_names), k, config, head
        self._dl = self.feature_names.index("draft_len")
        self.mean_ = torch.zeros(len(feature_names))
        self.scale_ = torch.ones(len(feature_names))
        self.history: list[float] = []  # validation MSE per epoch (when a validation split is given)
        widths = [len(feature_names)] + [config.hidden] * config.layers  # `layers` hidden ReLU layers, then the head
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            self.net = nn.Sequential(*[m for a, b in pairwise(widths) for m in (nn.Linear(a, b), nn.ReLU())],
                                     nn.Linear(widths[-1], 1 if head == "mean" else k))

    def _x(self, x: np.ndarray) -> torch.Tensor:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise DataError(f"payoff features: expected shape [N, {len(self.feature_names)}], got {x.shape}")
        if not np.isfinite(x).all():
            raise DataError("payoff features contain non-finite values")
        return torch.from_numpy(x)

    def _survival(self, out: torch.Tensor, draft_len: torch.Tensor) -> torch.Tensor:
        """[N, K] P(y >= j), zero beyond each draft's length (survival head)."""
        return _log_survival(out).exp() * (torch.arange(1, self.k + 1) <= draft_len[:, None])

    def _loss(self, out: torch.Tensor, y: torch.Tensor, draft_len: torch.Tensor) -> torch.Tensor:
        if self.head == "mean":
            return nn.functional.mse_loss(out[:, 0], y)
        j = torch.arange(1, self.k + 1)
        mask = (j <= draft_len[:, None]).float()  # [N, K] positions that carry a label
        z = (y[:, None] >= j).float()  # [N, K] survived to position j
        log_s = _log_survival(out).clamp(max=-1e-6)
        log_not = torch.log(-torch.expm1(log_s))  # log(1 - S), stable as S -> 1
        bce = -(z * log_s + (1 - z) * log_not)
        return (bce * mask).sum() / mask.sum().clamp(min=1)

    @_one_thread()
    def fit(self, x: np.ndarray, y: np.ndarray, x_val: np.ndarray | None = None,
            y_val: np.ndarray | None = None) -> PayoffMLP:
        """Train on [N, F] features and [N] accepted lengths; keep the epoch with the lowest validation MSE."""
        xt, yt = self._x(x), torch.as_tensor(np.asarray(y, dtype=np.float32))
        if len(xt) != len(yt) or len(xt) == 0:
            raise DataError(f"payoff fit: {len(xt)} feature rows vs {len(yt)} labels")
        self.mean_ = xt.mean(0)
        self.scale_ = xt.std(0).clamp(min=1e-6)
        dl, xs = xt[:, self._dl], (xt - self.mean_) / self.scale_
        cfg = self.config
        gen = torch.Generator().manual_seed(cfg.seed)
        opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        best, best_state = float("inf"), None
        for _ in range(cfg.epochs):
            self.net.train()
            for idx in torch.randperm(len(xs), generator=gen).split(cfg.batch_size):
                opt.zero_grad()
                self._loss(self.net(xs[idx]), yt[idx], dl[idx]).backward()
                opt.step()
            if x_val is not None:
                mse = float(np.mean((self.predict(x_val) - np.asarray(y_val)) ** 2))
                self.history.append(mse)
                if mse < best:
                    best, best_state = mse, copy.deepcopy(self.net.state_dict())
        if best_state is not None:
            self.net.load_state_dict(best_state)
        return self

    @torch.no_grad()
    @_one_thread()
    def _forward(self, x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, F] -> (the net's outputs on the standardized features [N, 1 or K], draft lengths [N])."""
        xt = self._x(x)
        self.net.eval()
        return self.net((xt - self.mean_) / self.scale_), xt[:, self._dl]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """[N, F] -> [N] expected accepted length (survival head: sum_j S_j)."""
        out, draft_len = self._forward(x)
        return (out[:, 0] if self.head == "mean" else self._survival(out, draft_len).sum(1)).numpy()

    def predict_survival(self, x: np.ndarray) -> np.ndarray:
        """[N, F] -> [N, K] P(accepted >= j), zero beyond each draft's length (survival head only)."""
        if self.head != "survival":
            raise ConfigError("predict_survival needs head='survival'")
        return self._survival(*self._forward(x)).numpy()

    def save(self, path: str | os.PathLike, **extra) -> None:
        """Weights + feature names + standardization (+ extra scalars such as tau); temp file, then rename."""
        path = Path(path)
        blob = {"state_dict": self.net.state_dict(), "feature_names": list(self.feature_names), "k": self.k,
                "head": self.head, "config": asdict(self.config), "mean": self.mean_, "scale": self.scale_,
                "extra": extra}
        with staged_file(path, "payoff model") as tmp:
            torch.save(blob, tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> tuple[PayoffMLP, dict]:
        """(model, extra) from `save`."""
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError) as e:
            raise ConfigError(f"{path}: cannot load payoff model: {e}") from None
        model = cls(tuple(blob["feature_names"]), blob["k"], PayoffConfig(**blob["config"]), blob["head"])
        model.net.load_state_dict(blob["state_dict"])
        model.mean_, model.scale_ = blob["mean"], blob["scale"]
        return model, blob["extra"]
