"""Warm-start vLLM's online acceptance estimator from an avkit coefficients.json (plugin.py).

vLLM 0.32's `OnlineAcceptanceEstimator` (vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py, Model
Runner V2) predicts p = sigmoid(omega * logit(q_max) + beta_j) and starts every deployment at omega = 0.5,
beta_j = -0.2. avkit's coefficients file holds the same model fitted offline: feature `logit_qmax`, `slope`
= omega, `intercepts` = beta_j. No vLLM hook sets the start, so this wraps the estimator's `__init__`
(named, installed only for version.SUPPORTED, tested in tests/test_vllm_plugin.py with vLLM's own class):
after vLLM's own initialisation the slope and intercepts are overwritten with the file's. The file is checked
first (estimators/coefficients.py): feature logit_qmax, K equal to the estimator's speculative steps, and
`trained_on` target / draft equal to the served ones (vLLM's current config) where both are known. A file
that fails is refused with one `avkit: error:` line and vLLM keeps its own start.
"""

from __future__ import annotations

from avkit.engines.vllm.version import error

FEATURE = "logit_qmax"  # vLLM's estimator feature


def served_pair():
    """(target, draft) of the vLLM config being built, ("", "") when none is current."""
    from vllm.config import get_current_vllm_config_or_none  # lazy: vllm

    config = get_current_vllm_config_or_none()
    if config is None or config.model_config is None:
        return "", ""
    spec = config.speculative_config
    return str(config.model_config.model), str(spec.model or "") if spec is not None else ""


def load(path: str, k: int) -> dict | None:
    """The checked coefficients for an estimator of `k` steps on the served pair, or None (one error line)."""
    from avkit.estimators.coefficients import ServedPair, load_coefficients  # lazy: vllm venv

    target, draft = served_pair()
    try:
        doc = load_coefficients(path, k=k, pair=ServedPair(target=target, draft=draft))
    except Exception as e:  # AvkitError: its one line
        error(f"{e}; vLLM's acceptance estimator keeps its own start")
        return None
    if doc.get("feature", FEATURE) != FEATURE:
        error(f"coefficients {path}: field 'feature' must be {FEATURE!r} (vLLM's estimator feature), got "
              f"{doc['feature']!r}; vLLM's acceptance estimator keeps its own start")
        return None
    return doc


def install(path: str) -> None:
    """Wrap OnlineAcceptanceEstimator.__init__ (idempotent)."""
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator  # lazy: vllm

    if getattr(OnlineAcceptanceEstimator, "_avkit_warm_start", None) is not None:
        return
    original = OnlineAcceptanceEstimator.__init__

    def __init__(self, max_num_reqs, num_speculative_steps, device, *args, **kwargs):
        original(self, max_num_reqs, num_speculative_steps, device, *args, **kwargs)
        doc = load(path, num_speculative_steps)
        if doc is not None:
            self.slope.fill_(float(doc["slope"]))
            self.intercepts.copy_(self.intercepts.new_tensor(doc["intercepts"]))

    OnlineAcceptanceEstimator.__init__ = __init__
    OnlineAcceptanceEstimator._avkit_warm_start = path


__all__ = ["install", "load", "served_pair"]
