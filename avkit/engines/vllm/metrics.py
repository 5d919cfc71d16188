"""A running vLLM's Prometheus spec-decode counters -> an acceptance profile (`avkit import vllm-metrics`).

vLLM exports only counters (no per-draft rows): `vllm:spec_decode_num_drafts_total` (request-steps that
verified drafts), `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and
`..._num_accepted_tokens_per_pos_total{position="j"}` (request-steps whose j-th draft was accepted: the
accepted length was > j). Summed over `engine` label values; one `model_name` (or `--model-name`).

Glossary (per draft position j = 0..K-1):
  reached_j      request-steps that verified slot j given all before it were accepted:
                 drafts for j = 0, accepted_per_pos[j-1] after (exact when every draft has K tokens,
                 i.e. num_draft_tokens == K * num_drafts; the profile says whether that held)
  conditional_j, survival_j   avkit/tune/acceptance.py's `position_table`, the one rule for traces and
                 counters: conditional = P(accept j | accepted 0..j-1), survival = P(accepted length > j)
The profile is an AGGREGATE (`"kind": "aggregate"`): it carries no features, so it serves no-spec and
fixed-K simulation (`avkit simulate --profile`) and never joins per-draft trace rows.
"""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path

from avkit.errors import DataError
from avkit.tune.acceptance import position_table

PREFIX = "vllm:spec_decode_"


def read_source(source: str, timeout_s: float = 10.0) -> str:
    """Prometheus text from an http(s) URL or a file."""
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=timeout_s) as r:
                return r.read().decode("utf-8", "replace")
        except OSError as e:
            raise DataError(f"{source}: cannot read the metrics ({e})") from None
    path = Path(source)
    if not path.is_file():
        raise DataError(f"{source}: no such file or URL")
    return path.read_text(encoding="utf-8", errors="replace")


def parse_counters(text: str, source: str, model_name: str = "") -> dict:
    """The spec-decode counters in `text`, summed over engines -> {drafts, draft_tokens, accepted, per_pos}."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: 50 ms, only when parsing

    sums = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    models: set[str] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise DataError(f"{source}: not Prometheus text ({e})") from None
    for fam in families:
        if not fam.name.startswith(PREFIX):
            continue
        what = fam.name[len(PREFIX):]
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue  # `_created` timestamps
            name = s.labels.get("model_name", "")
            models.add(name)
            if model_name and name != model_name:
                continue
            if not math.isfinite(s.value) or s.value < 0:
                raise DataError(f"{source}: {s.name}{s.labels} = {s.value}: a counter must be finite and >= 0")
            if what == "num_accepted_tokens_per_pos":
                try:
                    j = int(s.labels["position"])
                except (KeyError, ValueError):
                    raise DataError(f"{source}: {s.name} without an integer `position` label: {s.labels}") from None
                per_pos[j] = per_pos.get(j, 0.0) + s.value
            elif what in sums:
                sums[what] += s.value
    if model_name and model_name not in models:
        raise DataError(f"{source}: --model-name {model_name!r} not among the spec-decode metrics' models "
                        f"{sorted(models)}")
    if not model_name and len(models) > 1:
        raise DataError(f"{source}: spec-decode metrics of several models {sorted(models)}; choose one with "
                        "--model-name")
    if not per_pos or sums["num_drafts"] == 0:
        raise DataError(f"{source}: no spec-decode counters with drafts (vllm:spec_decode_num_drafts_total and "
                        "..._num_accepted_tokens_per_pos_total); is speculative decoding on and stats logging "
                        "enabled?")
    k = max(per_pos) + 1
    return {**{n: int(v) for n, v in sums.items()}, "accepted_per_pos": [int(per_pos.get(j, 0)) for j in range(k)],
            "model_name": model_name or next(iter(models), "")}


def acceptance_profile(counters: dict, source: str) -> dict:
    """Per-position conditional acceptance and survival with intervals (module glossary); JSON-ready."""
    drafts, acc = counters["num_drafts"], counters["accepted_per_pos"]
    k = len(acc)
    if any(b > a for a, b in zip([drafts, *acc], acc)):
        raise DataError(f"{source}: accepted_per_pos {acc} is not non-increasing from num_drafts {drafts}")
    reached = [drafts, *acc[:-1]]
    positions = position_table(drafts, acc)
    return {
        "kind": "aggregate", "source": source, "engine": "vllm", "k": k, "model_name": counters["model_name"],
        "num_drafts": drafts, "num_draft_tokens": counters["num_draft_tokens"],
        "num_accepted_tokens": counters["num_accepted_tokens"],
        "full_drafts": counters["num_draft_tokens"] == k * drafts,
        "mean_accepted_length": counters["num_accepted_tokens"] / drafts,
        "per_slot_acceptance": counters["num_accepted_tokens"] / max(sum(reached), 1),
        "positions": positions,
    }
