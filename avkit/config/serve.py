"""`avkit serve`: the HTTP front, request limits and snapshots around the engine's own configs."""

from __future__ import annotations

from dataclasses import dataclass, field

from avkit.config.engine import EngineConfig, ModelsConfig
from avkit.config.estimation import AdaptiveConfig, EstimatorConfig
from avkit.config.fields import Checked, checked
from avkit.errors import ConfigError
from avkit.validate import in_range, option, shown

SERVE_STATE_DIR = "~/.cache/avkit/serve"  # default home of the coefficient snapshot


@dataclass(frozen=True)
class HttpConfig(Checked):
    """The OpenAI-compatible front: where it listens, who may call it, how it admits and stops.

    Admission: at most the engine's `concurrency` requests decode at once and at most `queue_size`
    more wait; beyond that a request gets 429 + Retry-After.
    """

    host: str = "127.0.0.1"
    port: int = checked(8000, 0, 65535)
    api_key: str = ""  # require `Authorization: Bearer KEY` on every endpoint but /health
    served_model_name: str = ""  # name in /v1/models and responses ("" = the target id)
    queue_size: int = checked(64, 0)  # requests waiting beyond the engine's batch before 429
    retry_after_s: int = checked(1, 0)  # Retry-After header on 429
    max_body_bytes: int = checked(8 * 2**20, 1)  # larger request bodies get 413 (read before any parsing)
    log_requests: bool = False  # one access-log line per request (method, path, status, tokens, seconds)
    # SIGTERM: finish in-flight requests for this long, then cancel (exit within ~5 s)
    grace_period: float = checked(3.0, 0.0)


@dataclass(frozen=True)
class ServeConfig(Checked):
    """`avkit serve`: the models, the engine (engine.concurrency = requests decoding at once),
    the online estimator's refits, the adaptive policy, the HTTP front, and what serve adds itself."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)  # k, concurrency, max_len, seed
    online: EstimatorConfig = field(default_factory=EstimatorConfig)  # refit_interval of the live refits
    # estimator (a name in ESTIMATORS), coefficients (deployed file for the warm start; "" = the snapshot
    # or the shipped default, serve/startup.py), cost ("" = the policy's default), draft_gate
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    policy: str = "adaptive-stop"  # a name in POLICIES (avkit/scheduling/spec.py): its entry alone sets behaviour
    schedule: str = ""  # policy "schedule": K by batch size, from `avkit tune` JSON or its vLLM fragment
    snapshot: str = ""  # where live coefficients are snapshotted ("" = SERVE_STATE_DIR/coefficients.json)
    snapshot_every: int = checked(10, 1)  # snapshot every M refits (and on shutdown)
    resume: bool = True  # warm-start from the snapshot when it exists
    record: str = ""  # stream per-draft trace rows to this Parquet file while serving
    record_flush_s: float = checked(30.0, 0.0)  # --record: write buffered trace rows to disk this often
    max_new_tokens: int = checked(1024, 1)  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # chat default when the request sets none

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "default_max_tokens", 1, self.max_new_tokens)
        if (self.policy == "schedule") != bool(self.schedule):
            raise ConfigError("--schedule FILE goes with --policy schedule (and only with it), got --policy "
                              f"{self.policy}, --schedule {shown(self.schedule)}")


def policy_fields(policy: str, sets: dict, options: dict, given) -> dict:
    """The fields that `--policy policy` (as typed) and their own options both set: `options` holds each
    option's value (estimator, k, schedule), `given` names those typed on the command line, `sets` the one the
    policy's argument sets (estimator from adaptive:E, k from fixed:K or nospec, schedule from schedule:FILE).
    A field has one value, never a silent winner: an option given with another value than the policy's is a
    ConfigError naming both as typed; equal values, or only one of the two, stand."""
    for key, value in sets.items():
        if key in given and options[key] != value:
            raise ConfigError(f"--policy {policy} sets {option(key)} {shown(value)}, but {option(key)} "
                              f"{shown(options[key])} is given too: give one of them, or the same value")
    return options | sets


__all__ = ["SERVE_STATE_DIR", "HttpConfig", "ServeConfig", "policy_fields"]
