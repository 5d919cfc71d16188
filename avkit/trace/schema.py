"""Trace format v1: the contract between `record`, `fit`, `simulate` and other engines' exporters.

One Parquet row per draft slot (request r, engine step, draft position i). Glossary:
  draft slot   one proposed draft token x_i with its draft distribution q_i
  verified     the slot was sent to the target (the verify policy kept it)
  observed     verified and at or before the first rejection: it carries a label
  censored     not observed (after the first rejection, or trimmed): `accepted` is null
Features (q_max, q_2nd, entropy, logit_qmax) come from the draft logits scaled by temperature
(T=0 treated as 1) BEFORE top-p/top-k truncation; q_sampled is measured on the truncated
distribution the token was drawn from (and is a lossy feature).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from avkit import __version__

SCHEMA_VERSION = "1"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool
    doc: str


_STR = pa.dictionary(pa.int32(), pa.string())

# Every column, documented where it is defined. The first block is fixed by the v1 contract.
COLUMNS: tuple[Column, ...] = (
    Column("run_id", _STR, False, "identifier of the recording run"),
    Column("dataset", _STR, False, "workload the prompt came from, e.g. humaneval, mtbench"),
    Column("request_id", _STR, False, "request identifier, unique within a run"),
    Column("drafter", _STR, False, "who proposed the slot: `model` (draft model), `suffix` (cache) or `ngram` "
           "(vLLM's prompt lookup)"),
    Column("step", pa.int32(), False, "decode step index within the request, 0-based"),
    Column("position", pa.int16(), False, "draft position within the step, 0-based, < K"),
    Column("draft_token", pa.int32(), False, "the drawn draft token id"),
    Column("q_max", pa.float32(), False, "draft probability of the top-1 token (after temperature, before top-p)"),
    Column("q_2nd", pa.float32(), False, "draft probability of the top-2 token (after temperature, before top-p)"),
    Column("q_sampled", pa.float32(), False, "draft probability of the drawn token under the truncated "
           "distribution it was drawn from (LOSSY feature)"),
    Column("entropy", pa.float32(), False, "entropy of the draft distribution in nats (before top-p)"),
    Column("logit_qmax", pa.float32(), False, "log-odds of q_max from logits, m - logsumexp_{z!=argmax} l_z, "
           "clamped to [-40, 40]"),
    Column("target_prob", pa.float32(), True, "target probability p(draft_token) (null if not verified)"),
    Column("verified", pa.bool_(), False, "was this slot sent to the target"),
    Column("accepted", pa.bool_(), True, "target's decision; null when censored (after the first rejection "
           "or not verified)"),
    Column("num_drafted", pa.int16(), False, "drafts proposed for this request in this step"),
    Column("num_verified", pa.int16(), False, "drafts verified for this request in this step"),
    Column("num_accepted", pa.int16(), False, "drafts accepted for this request in this step (accepted length)"),
    Column("batch_size", pa.int32(), False, "requests in the engine step"),
    Column("step_time_ms", pa.float32(), False, "wall time of the whole engine step, milliseconds"),
    Column("temperature", pa.float32(), False, "sampling temperature of the request (0 = greedy)"),
    Column("top_p", pa.float32(), False, "top-p of the request"),
    # Extensions (v1 readers accept their absence; writers from avkit always emit them).
    Column("engine_step", pa.int64(), False, "global engine step index: rebuilds batches and refit rounds"),
    Column("accept_prob", pa.float32(), True, "probabilistic acceptance probability min(1, p/q_sampled) "
           "(1/0 under greedy); null if not verified"),
    Column("confidence", pa.float32(), True, "the live estimator's acceptance prediction when drafting "
           "(null when no estimator ran)"),
    Column("head_conf", pa.float32(), True, "a trained confidence head's prediction, where the drafter has one"),
    Column("match_len", pa.int16(), True, "cache drafts: length of the matched suffix (null for model drafts)"),
    Column("cache_score", pa.float32(), True, "cache drafts: sum of per-token frequency probabilities"),
)

REQUIRED = tuple(c.name for c in COLUMNS[:22])  # the fixed v1 contract

TRACE_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])

# Companion table of generations (one row per request), written beside the trace as
# `<trace stem>.generations.parquet`: hybrid-drafting replay needs the target's actual continuations.
GENERATION_COLUMNS: tuple[Column, ...] = (
    Column("run_id", _STR, False, "identifier of the recording run"),
    Column("request_id", pa.string(), False, "request identifier (joins the trace's request_id)"),
    Column("dataset", _STR, False, "workload the prompt came from"),
    Column("prompt_ids", pa.list_(pa.int32()), False, "prompt token ids after the chat template"),
    Column("output_ids", pa.list_(pa.int32()), False, "generated token ids"),
    Column("finish_reason", _STR, False, "`stop` (EOS or stop token) or `length` (max tokens)"),
    # Decode timing, read off the recorder's clock between engine steps (seconds since the Unix epoch;
    # null in files recorded before these columns). Tokens/s of a request including its prefill:
    # len(output_ids) / (last_token_s - admitted_s); in steady state (decode only, >= 2 tokens):
    # (len(output_ids) - 1) / (last_token_s - first_token_s). token_s rebuilds the engine's steps (its distinct
    # values): `bench/adaptive.py live` reads the tokens/s of the steps with every lane decoding from it.
    Column("admitted_s", pa.float64(), True, "when the request entered the engine (before its prefill)"),
    Column("first_token_s", pa.float64(), True, "when the engine step that emitted its first token returned"),
    Column("last_token_s", pa.float64(), True, "when the engine step that emitted its last token returned"),
    Column("token_s", pa.list_(pa.float64()), True, "when the engine step that emitted each output token "
           "returned, one per output_ids entry"),
)
GENERATION_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in GENERATION_COLUMNS])

# File metadata keys (Parquet key/value metadata, all values strings; JSON where structured).
META_SCHEMA_VERSION = "avkit.schema_version"
META_KEYS = {
    "avkit.schema_version": "trace format version, `1`",
    "avkit.version": "avkit package version that wrote the file",
    "avkit.target": "target model id or path",
    "avkit.target_sha256": "SHA-256 of the target weights file (or empty)",
    "avkit.draft": "draft model id or path",
    "avkit.draft_sha256": "SHA-256 of the draft weights file (or empty)",
    "avkit.k": "number of draft positions K",
    "avkit.temperature": "sampling temperature",
    "avkit.top_p": "top-p",
    "avkit.drafter": "drafter kind: model, suffix, hybrid, ngram",
    "avkit.seed": "run seed",
    "avkit.datasets": "JSON list of datasets in the file",
    "avkit.policy": "verify policy used while recording, as its spec (`full`, `fixed:K`, `adaptive:ESTIMATOR`, "
                    "`schedule:FILE`, ...; scheduling/spec.py)",
    "avkit.synthetic": "JSON of the true coefficients, for synthetic traces only",
    "avkit.engine": "who drafted and verified: `native` (avkit's runtime) or `vllm X.Y.Z` (docs/vllm.md)",
    "avkit.vllm.draft_sample_method": "vLLM recordings: `probabilistic` or `greedy` drafting at T > 0",
}


def run_metadata(target, draft, **settings) -> dict[str, str]:
    """A recorded trace's file metadata (META_KEYS): the writer's version, the models by id and weights hash
    (`target`, `draft`: loaded models with `model_id` and `sha256`, or a name alone: vLLM's, no hash; draft None:
    none), and the run's `settings` by key without the `avkit.` prefix (strings as they are, lists as JSON,
    anything else through str)."""
    models = {}
    for role, m in (("target", target), ("draft", draft)):
        models[f"avkit.{role}"], models[f"avkit.{role}_sha256"] = (
            ("", "") if m is None else (m, "") if isinstance(m, str) else (m.model_id, m.sha256 or ""))
    return {"avkit.version": __version__, **models,
            **{f"avkit.{key}": value if isinstance(value, str) else json.dumps(value) if isinstance(value, list)
               else str(value) for key, value in settings.items()}}


def generations_path(trace_path):
    """Path of the generations table that sits beside a trace file."""
    p = Path(trace_path)
    return p.with_name(p.name.removesuffix(".parquet") + ".generations.parquet")
