"""`fit_hvd`: replay greedy traces, train the payoff predictor, choose tau, score every router.

Pipeline: generations + greedy traces -> `replay` rows (one per request and decode position) ->
split by request (per dataset: train / validation / test) -> routers fitted on train, thresholds
chosen on validation -> metrics on test per dataset and overall -> files in `out_dir`:
  payoff_mlp.pt        mean-head PayoffMLP + tau + feature names (what the live router loads)
  payoff_survival.pt   survival-head PayoffMLP + the model-survival table and the cost model
                       (what the live joint router, `avkit.hvd.joint`, loads)
  hvd_metrics.json     the metrics table, thresholds, feature ablation and replay facts
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl

from avkit.config import HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.errors import DataError
from avkit.hvd.cost import linear_table, summary
from avkit.hvd.features import FEATURE_GROUPS, TokenClasses, token_classes_for
from avkit.hvd.path import evaluate
from avkit.hvd.replay import ReplayGeneration, load_generations, replay
from avkit.hvd.router import ROUTERS, MLPRouter, RouterContext, decode_batched, make_router
from avkit.hvd.verdict import dataset_verdict
from avkit.jsonsafe import dumps
from avkit.provenance import inputs_record
from avkit.scheduling.cost import CostTable
from avkit.staged import StagedOutputs

ABLATION = (("base",), ("base", "history"), ("base", "history", "structure"),
            ("base", "history", "structure", "copy"))


CONCURRENCY = (1, 8, 32, 128)
HVD_FILES = ("payoff_mlp.pt", "payoff_survival.pt", "hvd_metrics.json")


@dataclass
class HvdResult:
    metrics: pl.DataFrame  # router x dataset (test split)
    ablation: pl.DataFrame  # feature groups -> validation MSE, test throughput of the mlp router
    budget: pl.DataFrame  # concurrency x (mlp full, survival full, survival + one budget) throughput
    thresholds: dict[str, float]
    info: dict = field(default_factory=dict)  # replay facts: rows, requests, seconds, splits
    files: list[str] = field(default_factory=list)
    verdict: pl.DataFrame = field(default_factory=pl.DataFrame)  # per dataset: best HVD vs best single (verdict.py)


TURN = r"/turn\d+$"  # a follow-up turn `<...>/turn<n>` belongs to its first turn's conversation (record/requests.py)


def split_by_request(table: pl.DataFrame, config: PayoffConfig) -> np.ndarray:
    """[R] split label per row ('train' / 'val' / 'test'): conversations (a request and its follow-up
    turns, which reuse its text) shuffled per dataset with the seed, so no conversation is both trained
    on and tested; a dataset with fewer than 3 conversations goes to train whole."""
    rng = np.random.default_rng(config.seed)
    conv = table["request_id"].cast(pl.String).str.replace(TURN, "")  # [R]
    names, labels = [], []
    for (_,), grp in pl.DataFrame({"dataset": table["dataset"], "conv": conv}).unique(maintain_order=True) \
            .group_by("dataset", maintain_order=True):
        ids = grp["conv"].to_list()
        rank = np.argsort(rng.permutation(len(ids)))  # [n] each conversation's place in the shuffle
        small = len(ids) < 3  # too few to hold any out: all train
        n_val = 0 if small else max(1, round(config.val_fraction * len(ids)))
        n_test = 0 if small else max(1, round(config.test_fraction * len(ids)))
        names += ids
        labels += np.where(rank < n_val, "val", np.where(rank < n_val + n_test, "test", "train")).tolist()
    lookup = pl.DataFrame({"conv": names, "split": labels}).unique("conv", keep="first")
    return pl.DataFrame({"conv": conv}).join(lookup, on="conv", how="left", maintain_order="left")["split"].to_numpy()


def _kept(groups: tuple[str, ...], structure: bool) -> tuple[str, ...]:
    """The feature groups the rows carry: the structure group only when a tokenizer gave its table."""
    return tuple(g for g in groups if structure or g != "structure")


def _ablation(train, val, test, ctx: RouterContext, structure: bool) -> pl.DataFrame:
    rows = []
    for groups in dict.fromkeys(_kept(gs, structure) for gs in ABLATION):
        feats = tuple(n for g in groups for n in FEATURE_GROUPS[g])
        c = replace(ctx, features=feats)
        r = MLPRouter()
        r.fit(train, val, c)
        mse = min(r.model.history) if r.model.history else float("nan")
        m = evaluate(test, {"mlp": r.route(test, c), "model": make_router("model").route(test, c),
                            "suffix": make_router("suffix").route(test, c)}, c.cost, c.k)
        row = m.filter((pl.col("router") == "mlp") & (pl.col("dataset") == "overall"))
        rows.append({"features": "+".join(groups), "n_features": len(feats), "val_mse": mse,
                     "throughput": row["throughput"][0], "speedup_vs_model": row["speedup_vs_model"][0]})
    return pl.DataFrame(rows)


def _budget(test: pl.DataFrame, fitted: dict, ctx: RouterContext) -> pl.DataFrame:
    """Batched decoding of the test requests: threshold routing with full verification against
    survival routing whose cache and model slots share one adaptive budget."""
    n_req = test["request_id"].n_unique()
    return pl.DataFrame([{"router": name, **decode_batched(fitted, name, test, ctx, c)}
                         for c in sorted({min(c, n_req) for c in CONCURRENCY})
                         for name in ("model", "mlp", "survival", "survival+budget")
                         if name.removesuffix("+budget") in fitted])


def fit_hvd_generations(gens: list[ReplayGeneration], out_dir: str | os.PathLike | None = None, *,
                        cache_config: SuffixCacheConfig = SuffixCacheConfig(),
                        replay_config: HvdReplayConfig = HvdReplayConfig(),
                        classes: np.ndarray | None = None, progress: bool = False,
                        extra_info: dict | None = None, **kwargs) -> HvdResult:
    """Replay, fit and score on in-memory generations (the trace-free core of `fit_hvd`)."""
    t0 = time.perf_counter()
    table = replay(gens, cache_config, replay_config, classes, progress)
    extra = {"replay_s": round(time.perf_counter() - t0, 2), "suffix_cache": asdict(cache_config),
             **(extra_info or {})}
    return fit_hvd_table(table, out_dir, replay_config=replay_config, structure=classes is not None,
                         extra_info=extra, **kwargs)


def fit_hvd_table(table: pl.DataFrame, out_dir: str | os.PathLike | None = None, *,
                  replay_config: HvdReplayConfig = HvdReplayConfig(), payoff_config: PayoffConfig = PayoffConfig(),
                  cost: CostTable | None = None, structure: bool = True,
                  routers: tuple[str, ...] = tuple(ROUTERS), ablation: bool = True,
                  extra_info: dict | None = None, outputs: StagedOutputs | None = None) -> HvdResult:
    """Fit routers on replayed rows (`replay`) and score them on held-out requests. `structure`: the rows carry
    token-structure features; `cost` in target forwards (avkit/hvd/cost.py; None: the linear model)."""
    split = split_by_request(table, payoff_config)
    train, val, test = (table.filter(pl.Series(split == s)) for s in ("train", "val", "test"))
    if not (train.height and val.height and test.height):
        raise DataError(f"hvd fit: a split is empty (rows train/val/test = {train.height}/{val.height}/"
                        f"{test.height}); record more requests per dataset (>= 3)")
    cost = linear_table() if cost is None else cost
    feats = tuple(n for g in _kept(ABLATION[-1], structure) for n in FEATURE_GROUPS[g])
    ctx = RouterContext(replay_config.k, cost, feats, payoff_config)
    fitted = {}
    for name in dict.fromkeys(("model", "suffix", *routers)):
        fitted[name] = make_router(name)
        fitted[name].fit(train, val, ctx)
    preds = {n: r.predict(test, ctx) for n, r in fitted.items() if hasattr(r, "predict")}
    metrics = evaluate(test, {n: r.route(test, ctx) for n, r in fitted.items()}, cost, replay_config.k,
                       replay_config.high_payoff, preds)
    thresholds = {n: float(r.tau) for n, r in fitted.items() if hasattr(r, "tau")}
    vd, td = val.filter(pl.col("draft_len") > 0), train.filter(pl.col("draft_len") > 0)
    yv = vd["cache_acc"].to_numpy()
    val_mse = {"mean_of_train": float(np.mean((td["cache_acc"].mean() - yv) ** 2))}
    val_mse.update({n: float(np.mean((fitted[n].predict(vd, ctx) - yv) ** 2))
                    for n in ("table", "mlp", "survival") if n in fitted})
    abl = _ablation(train, val, test, ctx, structure) if ablation else pl.DataFrame()
    drafted = table.filter(pl.col("draft_len") > 0)  # rows with a cache draft
    info = {"rows": table.height, "requests": table["request_id"].n_unique(), "rows_with_cache_draft": drafted.height,
            "split_requests": {s: int(np.unique(table["request_id"].to_numpy()[split == s]).size)
                               for s in ("train", "val", "test")},
            "mean_cache_acc": float(table["cache_acc"].mean()), "mean_model_acc": float(table["model_acc"].mean()),
            "high_payoff_rate": float((drafted["cache_acc"] >= replay_config.high_payoff).mean()),
            "mean_cache_draft_len": float(drafted["draft_len"].mean()), "val_mse": val_mse,
            "features": list(ctx.features), "k": replay_config.k, "high_payoff": replay_config.high_payoff,
            "cost": summary(cost),
            "model_scale": float(fitted["survival"].model_scale) if "survival" in fitted else None,
            "payoff": asdict(payoff_config), **(extra_info or {})}
    result = HvdResult(metrics, abl, _budget(test, fitted, ctx), thresholds, info,
                       verdict=dataset_verdict(test, metrics, fitted, ctx))
    if out_dir is not None:  # with the caller's `outputs`, staged only: the caller commits them
        with StagedOutputs() if outputs is None else contextlib.nullcontext(outputs) as staged:
            result.files = _write(result, fitted, cost, Path(out_dir), staged)
    return result


def result_json(result: HvdResult) -> dict:
    """hvd_metrics.json's content (what the report reads back)."""
    return {"metrics": result.metrics.to_dicts(), "ablation": result.ablation.to_dicts(),
            "budget": result.budget.to_dicts(), "verdict": result.verdict.to_dicts(),
            "thresholds": result.thresholds, "info": result.info}


def reserve_hvd_outputs(out_dir, outputs: StagedOutputs, name: str = "--out") -> dict[str, Path]:
    """Reserve the hvd files in `out_dir` before the replay (checked writable now); -> file -> temp."""
    return {f: outputs.file(Path(out_dir) / f, name) for f in HVD_FILES}


def _write(result: HvdResult, fitted: dict, cost: CostTable, out: Path, outputs: StagedOutputs) -> list[str]:
    tmp = reserve_hvd_outputs(out, outputs)
    files = []
    for name, fname in (("mlp", "payoff_mlp.pt"), ("survival", "payoff_survival.pt")):
        if name in fitted and fitted[name].model is not None:
            r = fitted[name]
            joint = {**r.joint(cost).extra(), "model_scale": r.model_scale} if name == "survival" else {}
            r.model.save(tmp[fname], tau=r.tau, **joint)
            files.append(str(out / fname))
        else:
            outputs.discard(out / fname)  # not fitted this run: an older file stays as it was
    tmp["hvd_metrics.json"].write_text(dumps(result_json(result), indent=1))  # NaN (an undefined precision) -> null
    return files + [str(out / "hvd_metrics.json")]


def load_traces(trace_paths: list[str | os.PathLike], tokenizer: str | None = None) -> tuple[list[ReplayGeneration],
                                                                                        TokenClasses, dict]:
    """Greedy traces (each with its `.generations.parquet`) -> (generations, their token classes
    (`token_classes_for`, avkit/hvd/features.py), the facts hvd_metrics.json's `info` records about them)."""
    tc = token_classes_for(trace_paths, tokenizer)
    gens, facts = load_generations(trace_paths)
    return gens, tc, {"traces": [str(p) for p in trace_paths], "tokenizer": tc.source,
                      "structure_features": tc.table is not None,
                      "unknown_model_positions": facts["unknown_model_positions"],
                      "temperatures": sorted(facts["temperatures"])}


def fit_hvd(trace_paths: list[str | os.PathLike], out_dir: str | os.PathLike | None, *,
            tokenizer: str | None = None, **kwargs) -> HvdResult:
    """`avkit hvd`, `avkit fit --hvd`: `load_traces` -> payoff predictor + metrics; `info["tokenizer"]` says where
    the token-structure features came from, or that they were left out."""
    gens, tc, extra = load_traces(trace_paths, tokenizer)
    cost = summary(kwargs.get("cost") or linear_table())
    extra["inputs"] = inputs_record("avkit hvd", trace_paths, tokenizer=tc.source,
                                    k=kwargs.get("replay_config", HvdReplayConfig()).k,
                                    draft_step_cost=cost["draft_step_cost"], cost_source=cost["source"] or "linear")
    return fit_hvd_generations(gens, out_dir, classes=tc.table, extra_info=extra, **kwargs)
