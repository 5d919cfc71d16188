"""IRLS statistics of one refit round, torch reference: the spec and CPU path of `irls_stats_triton`.

The online estimator p_i = sigma(omega * f + beta_i) refits with one Newton step on the arrowhead
Hessian (docs/estimator.md). All it needs from a round of drafts are six sums per position i:
  a_i = sum w f^2,  b_i = sum w f,  c_i = sum w,  g0_i = sum r f,  g1_i = sum r,  n_i = count
over the observed slots at position i, with w = p (1 - p) and r = y - p at the prediction p made
when drafting. Memory is O(K) per round, whatever the number of steps and requests.
Glossary:
  f   feature of a draft slot (e.g. logit(q_max))        [...]
  p   the prediction used when deciding                  [...]
  y   label: 1 accepted, 0 rejected (unobserved: any)    [...]
  observed  verified and at or before the first rejection [...] bool
"""

from __future__ import annotations

import torch

from avkit.errors import DataError
from avkit.estimators.irls import IrlsStats  # the one statistics type (fields: [K] tensors here)


def irls_inputs(features, positions, predictions, labels, observed, num_positions: int, check: bool = True):
    """Broadcast the five inputs to one shape and flatten: [N] float32 x3, int64, bool.
    check=False skips the position check (the engine's positions are an arange: no host read)."""
    if num_positions < 1:
        raise DataError(f"irls_stats: num_positions must be >= 1, got {num_positions}")
    f = torch.as_tensor(features)
    dev = f.device
    ts = [f, torch.as_tensor(positions, device=dev), torch.as_tensor(predictions, device=dev),
          torch.as_tensor(labels, device=dev), torch.as_tensor(observed, device=dev)]
    try:
        ts = torch.broadcast_tensors(*ts)
    except RuntimeError:
        shapes = [tuple(t.shape) for t in ts]
        raise DataError(f"irls_stats: features/positions/predictions/labels/observed shapes {shapes} "
                        "do not broadcast") from None
    f, pos, p, y, obs = (t.reshape(-1) for t in ts)
    pos, obs = pos.to(torch.int64), obs.to(torch.bool)
    if check and dev.type == "cpu" and obs.any():  # on a GPU these checks would cost a sync per round
        bad = obs & ((pos < 0) | (pos >= num_positions))
        if bad.any():
            raise DataError(f"irls_stats: observed positions must be in [0, {num_positions}), "
                            f"got {int(pos[bad][0])}")
    return f.float(), pos, p.float(), y.float(), obs


@torch.no_grad()
def irls_stats_ref(features, positions, predictions, labels, observed, num_positions: int, *,
                   check: bool = True) -> IrlsStats:
    """Per-position sums a, b, c, g0, g1, n over the observed slots (float64 accumulation).

    Examples
    --------
    >>> s = irls_stats_ref(torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), torch.tensor([0.5, 0.5]),
    ...                    torch.tensor([1.0, 0.0]), torch.tensor([True, True]), 2)
    >>> s.a.tolist(), s.g1.tolist(), s.n.tolist()
    ([0.25, 1.0], [0.5, -0.5], [1, 1])
    """
    f, pos, p, y, obs = irls_inputs(features, positions, predictions, labels, observed, num_positions, check)
    # Fixed shapes (no boolean indexing, which would read the device): unobserved rows weigh 0.
    keep = obs.double()  # [N]
    f, p, y = f.double(), p.double(), torch.nan_to_num(y.double(), nan=0.0)  # [N]
    f, p = f.masked_fill(~obs, 0.0), p.masked_fill(~obs, 0.0)
    w = p * (1.0 - p)  # Fisher weight of each observation (0 where unobserved)
    r = (y - p) * keep  # residual (gradient of the log-likelihood in the logit)
    cols = torch.stack([w * f * f, w * f, w, r * f, r], dim=1)  # [N, 5]
    pos = pos.masked_fill(~obs, 0)
    sums = torch.zeros(num_positions, 5, dtype=torch.float64, device=f.device).index_add_(0, pos, cols)
    n = torch.zeros(num_positions, dtype=torch.int64, device=f.device).index_add_(0, pos, obs.long())
    return IrlsStats(*sums.unbind(1), n=n)
