"""`avkit record`: workloads through the engine into a trace, composed of the engine's own configs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from avkit.config.engine import RUN_ENGINES, EngineConfig, ModelsConfig, SamplingConfig
from avkit.config.fields import Checked, checked
from avkit.errors import ConfigError
from avkit.validate import shown

DEFAULT_RECORD_DATASETS = ("humaneval", "mtbench")


@dataclass(frozen=True)
class RecordConfig(Checked):
    """`avkit record`: run workloads through the engine and stream one trace row per draft slot.

    The default is a small seeded HumanEval + MT-Bench mix with the real pair that finishes in
    minutes on 2 CPU cores. `num_prompts` is per dataset; MT-Bench adds its second turns.
    """

    models: ModelsConfig = field(default_factory=ModelsConfig)
    # how the pair decodes: k, concurrency (requests decoding at once), seed (prompt order and sampling),
    # kernels; the context limit is sized by `decoding_for_run` from the prompt and generation caps
    decoding: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # temperature, top_p, max_new_tokens
    dataset: tuple[str, ...] = DEFAULT_RECORD_DATASETS  # workload names or .jsonl files (a repeated option)
    num_prompts: int = checked(4, 1)  # prompts per dataset (first turns)
    max_prompt_tokens: int = checked(768, 1)  # longer prompts are skipped (prefill dominates CPU time)
    out: str = "traces/record.parquet"
    resume: bool = False  # continue an existing file: finished requests are skipped
    overwrite: bool = False  # replace an existing file (only when the new run finishes; see avkit/record)
    # stop admitting a dataset's prompts after this many labelled slots (0 = off)
    slots_per_dataset: int = checked(0, 0)
    row_group_rows: int = checked(65536, 1)
    # also flush (and make the partial file readable) this often
    flush_interval: float = checked(60.0, 0.0, lo_open=True)
    # torch intra-op threads (0 = torch's default); 1 is fastest on an oversubscribed CPU
    threads: int = checked(0, 0)
    # native (avkit's runtime) | vllm (vLLM's offline engine, docs/vllm.md)
    engine: str = checked("native", choices=RUN_ENGINES)
    vllm_python: str = ""  # vllm: the venv's python ("" = $AVKIT_VLLM_PYTHON, else .venv-vllm/bin/python)
    # vllm, T > 0: draw drafts from q (probabilistic) or take argmax
    vllm_draft_sampling: str = checked("probabilistic", choices=("probabilistic", "greedy"))
    policy: str = "full"  # the verify policy recorded, a spec (avkit/scheduling/spec.py): full, fixed:K, adaptive:E, ...
    cost: str = ""  # adaptive policies' cost table ("" = AdaptiveConfig's default)
    coefficients: str = ""  # adaptive policies' estimator warm start (coefficients.json; "" = reference constants)

    def __post_init__(self):
        if not self.dataset:
            raise ConfigError("--dataset must name at least one workload")
        super().__post_init__()
        if not str(self.out).endswith(".parquet"):
            raise ConfigError(f"--out must be a .parquet path, got {shown(self.out)}")
        if self.policy != "full" and self.engine != "native":
            raise ConfigError(f"--policy {self.policy} runs in avkit's own engine only (--engine {self.engine} "
                              "verifies with its own rule)")
        if self.engine == "vllm" and self.slots_per_dataset:
            raise ConfigError("--slots-per-dataset runs in avkit's own engine only (--engine vllm hands vLLM every "
                              "prompt up front)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: continue the file or replace it")

    @property
    def decoding_for_run(self) -> EngineConfig:
        """The engine config with room for the longest admitted prompt, its generation and K drafts."""
        return replace(self.decoding,
                       max_len=self.max_prompt_tokens + self.sampling.max_new_tokens + self.decoding.k + 2)


__all__ = ["DEFAULT_RECORD_DATASETS", "RecordConfig"]
