"""`bench/adaptive.py live`: adaptive verification against the best fixed K through `avkit record --policy`: a screen
of every policy, then the finalists' runs each bracketed by adaptive runs, paired 95% intervals (bench/README.md:
the protocol) ->
bench/results/adaptive_live.{md,json}. Cells merge into the JSON as each finishes (a stopped run keeps them);
`--resume` skips the cells it already holds, so the grid can be measured in pieces.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl

from avkit.cli import app
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET
from avkit.scheduling.cost import CostTable
from avkit.sim.steps import trace_steps
from avkit.trace.schema import generations_path
from common import csv, header, load, options, paired_ratio, tiny_pair, today, write

PROTOCOL = 4  # cells of another protocol stay in the store, are not resumed and not shown (1: steady = each
# request's first-to-last token span, which held the other lanes' admission prefills; 2: each adaptive run started
# from --cost, so every run spent its first steps on the prior's prices; 3: every policy in every round, paired by
# round: the machine drifted by 10-15% within a round, so the pairs spread over +-10%)


def run_tokens_s(gens: pl.DataFrame, concurrency: int) -> dict:
    """Tokens/s of one run from its generations table (bench/README.md: the protocol). Steady: over the engine
    steps (the distinct values of token_s) that began with all `concurrency` lanes decoding and prefilled no
    one (no request got its first token in them); each step lasts from the previous step's end to its own."""
    n = gens["output_ids"].list.len().to_numpy().astype(np.float64)  # [R] tokens per request
    times = [np.asarray(t) for t in gens["token_s"].to_list()]  # R x [n_r] step end per output token
    first, last = np.array([t[0] for t in times]), np.array([t[-1] for t in times])  # [R]
    ends, emitted = np.unique(np.concatenate(times), return_counts=True)  # [S] step ends, tokens per step
    decoding = (first[None, :] < ends[:, None]) & (last[None, :] >= ends[:, None])  # [S, R] decoding into the step
    steady = (decoding.sum(1) == concurrency) & ~np.isin(ends, first)  # [S]
    steady[0] = False  # the first step has no previous end
    seconds = np.diff(ends, prepend=ends[0])  # [S]
    return {"tok_s": float(n.sum() / (last.max() - gens["admitted_s"].min())),
            "decode_tok_s": float(emitted[steady].sum() / seconds[steady].sum()) if steady.any() else float("nan"),
            "steady_tokens": int(emitted[steady].sum()), "steady_steps": int(steady.sum()), "new_tokens": float(n.mean())}


def record(args, out: Path, policy: str, dataset: str, temperature: float, concurrency: int,
           cost: Path | None = None) -> dict:
    """One `avkit record --policy` run; -> its tokens/s. `cost`: the adaptive policy's cost model (None: --cost)."""
    argv = ["record", "--target", args.target, "--draft", args.draft, "--dataset", dataset,
            "--num-prompts", str(args.requests_per_lane * concurrency), "--max-new-tokens", str(args.max_new_tokens),
            "-k", str(max(args.ks)), "--temperature", str(temperature), "--concurrency", str(concurrency),
            "--seed", str(args.seed), "--policy", policy, "--out", str(out), "--overwrite", "--no-progress",
            "--dtype", args.dtype, "--threads", str(args.threads)]
    if cost or args.cost:  # "{T}" in the path: one table per temperature (each profiled at its T)
        argv += ["--cost", str(cost or args.cost.replace("{T}", f"{temperature:g}"))]
    if args.coefficients and Path(args.coefficients).is_file():
        argv += ["--coefficients", args.coefficients]
    if policy == args.adaptive and args.learn_cost:  # as avkit serve: the cost model learned from the steps
        argv += ["--learn-cost", "--cost-out", str(out.with_suffix(".learned_cost.json"))]
    with open(os.devnull, "w") as quiet, redirect_stdout(quiet), redirect_stderr(quiet):  # record's tables
        try:
            app(argv)  # the CLI exits with the command's status
        except SystemExit as e:
            if e.code:
                raise SystemExit(f"avkit {' '.join(argv)}: exit {e.code}") from None
    return run_tokens_s(pl.read_parquet(generations_path(out)), concurrency)


def cell(args, work: Path, dataset: str, temperature: float, concurrency: int) -> dict:
    """A screen (every policy once), then --repeats rounds of the --finalists best fixed K, each run bracketed by
    adaptive runs (bench/README.md: the protocol); -> per policy its runs (each with its place `seq` in the cell's
    order), and adaptive / best fixed K."""
    fixed = [f"fixed:{k}" for k in args.ks]
    runs: dict[str, list[dict]] = {p: [] for p in fixed + [args.adaptive]}
    started = {"date": today(), "commit": commit(), "load": round(load(), 2), "protocol": PROTOCOL}
    kept = f"fixed:{max(args.ks)}"  # its screen run's trace is kept: every slot labelled, what the simulator replays
    # learning, the adaptive policy carries its cost model from run to run, as a serving engine does: each run starts
    # from the model the previous one learned, the first from an unmeasured warm-up run's (bench/README.md)
    carried = work / "carried.learned_cost.json"
    steps: list[dict] = []
    carried.unlink(missing_ok=True)
    if args.learn_cost:
        record(args, work / "run.parquet", args.adaptive, dataset, temperature, concurrency)
        (work / "run.learned_cost.json").replace(carried)

    def run(p: str, rep: int) -> None:
        cost = carried if p == args.adaptive and carried.is_file() else None
        runs[p].append({**record(args, work / "run.parquet", p, dataset, temperature, concurrency, cost),
                        "seq": sum(map(len, runs.values())), "repeat": rep})
        if args.traces:  # every run's drafting steps as the cost learner sees them (bench/live.py cost --steps)
            steps.extend({"policy": p, "repeat": rep, **asdict(t)} for t in trace_steps(work / "run.parquet"))
        if p == kept and rep == 0 and args.traces:
            Path(args.traces).mkdir(parents=True, exist_ok=True)
            kept_at = trace_path(args, dataset, temperature, concurrency)
            (work / "run.parquet").replace(kept_at)
            generations_path(work / "run.parquet").replace(generations_path(kept_at))  # token_s: its steps
        if p == args.adaptive and args.learn_cost:  # carried on; the last run's is the cell's (--predict cell)
            (work / "run.learned_cost.json").replace(carried)
        print(f"{dataset} T={temperature} c={concurrency} round {rep}: {p} {runs[p][-1]['decode_tok_s']:.2f} tok/s "
              f"steady over {runs[p][-1]['steady_tokens']} tokens", file=sys.stderr, flush=True)

    for p in fixed + [args.adaptive]:  # the screen: it only chooses the finalists, no ratio reads it
        run(p, 0)
    ranked = sorted(fixed, key=lambda p: -runs[p][0]["decode_tok_s"])
    finalists = ranked[:args.finalists] + [f"fixed:{k}" for k in args.keep if f"fixed:{k}" not in ranked[:args.finalists]]
    run(args.adaptive, 1)
    for rep in range(1, args.repeats + 1):  # A f1 A f2 A f1 A ...: each finalist's run between two adaptive runs
        for f in finalists:
            run(f, rep)
            run(args.adaptive, rep)
    if args.learn_cost and args.traces:
        carried.replace(learned_path(args, dataset, temperature, concurrency))
    if args.traces:
        write({trace_path(args, dataset, temperature, concurrency).with_suffix(".steps.jsonl"):
               "".join(json.dumps(s) + "\n" for s in steps)})
    return compare(args, {"dataset": Path(dataset).name, "temperature": temperature, "concurrency": concurrency,
                          **started, "finalists": finalists, "runs": runs})


def bracketed(runs: dict[str, list[dict]], adaptive: str, fixed: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (adaptive, fixed) per bracketed run of `fixed`: its rate and the geometric mean of the two adaptive runs
    just before and after it (a drift of the machine that is linear over the three runs cancels)."""
    at = {r["seq"]: r[metric] for r in runs[adaptive]}
    pairs = [(np.sqrt(at[r["seq"] - 1] * at[r["seq"] + 1]), r[metric]) for r in runs[fixed] if r["repeat"] > 0]
    return np.array([a for a, _ in pairs]), np.array([f for _, f in pairs])  # [repeats] each

def commit() -> str:
    """The checkout's commit (a cell is measured on one; pieces of a grid name theirs)."""
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "?"


def trace_path(args, dataset: str, temperature: float, concurrency: int) -> Path:
    """Where a cell's kept trace goes: --traces/<dataset>_T<T>_c<c>.parquet."""
    return Path(args.traces) / f"{Path(dataset).stem}_T{temperature:g}_c{concurrency}.parquet"


def learned_path(args, dataset: str, temperature: float, concurrency: int) -> Path:
    """Where a cell's last adaptive run leaves the cost model it carried: beside the kept trace."""
    return trace_path(args, dataset, temperature, concurrency).with_suffix(".learned_cost.json")


def key(c: dict) -> tuple:
    return c["dataset"], float(c["temperature"]), c["concurrency"]


def compare(args, out: dict) -> dict:
    """Adaptive / best fixed K over a cell's bracketed runs, both metrics: the best of the finalists by their mean
    over the rounds, its runs paired with their brackets."""
    for metric in ("decode_tok_s", "tok_s"):
        pairs = {f: bracketed(out["runs"], args.adaptive, f, metric) for f in out["finalists"]}
        best = max(pairs, key=lambda f: pairs[f][1].mean())
        out[metric] = {"best_fixed": best, **paired_ratio(*pairs[best]),
                       "mean": {p: float(np.mean([r[metric] for r in rs])) for p, rs in out["runs"].items()}}
    return out


def mixed(args, cells: list[dict]) -> list[dict]:
    """Per dataset x temperature with every --concurrency measured: their equal-time mix (bench/README.md: mixed),
    against the fixed K that was a finalist in every one of its cells."""
    out = []
    for d in dict.fromkeys(c["dataset"] for c in cells):
        for t in sorted({float(c["temperature"]) for c in cells if c["dataset"] == d}):
            part = [c for c in cells if c["dataset"] == d and c["temperature"] == t]
            if len(part) < 2 or {c["concurrency"] for c in part} != set(args.concurrency):
                continue
            eligible = [f for f in part[0]["finalists"] if all(f in c["finalists"] for c in part)]
            if not eligible:
                print(f"{d} T={t:g}: no fixed K is a finalist at every concurrency: no mix", file=sys.stderr)
                continue
            mix = {"dataset": d, "temperature": t, "concurrency": "mixed", "finalists": eligible,
                   "runs": {p: [r for c in part for r in c["runs"][p]] for p in part[0]["runs"]}}
            for metric in ("decode_tok_s", "tok_s"):  # round i's mix: the mean of the cells' round-i pairs
                pairs = {f: [np.mean(v, axis=0) for v in zip(*(bracketed(c["runs"], args.adaptive, f, metric)
                                                              for c in part))] for f in eligible}
                best = max(pairs, key=lambda f: pairs[f][1].mean())
                mix[metric] = {"best_fixed": best, **paired_ratio(*pairs[best]),
                               "mean": {p: float(np.mean([c[metric]["mean"][p] for c in part])) for p in mix["runs"]}}
            out.append(mix)
    return out


def markdown(args, cells: list[dict]) -> str:
    lines = [header(f"Live adaptive verification: {args.adaptive} / best fixed K"),
             f"{args.target} + {args.draft}, {args.dtype}, "
             f"{args.threads} threads, {args.requests_per_lane} x c requests per run, up to {args.max_new_tokens} new "
             f"tokens, fixed K in {args.ks}. Per cell a screen runs every policy once and picks the {args.finalists} "
             f"fixed K of the best steady rates (the finalists); then {args.repeats} rounds run each finalist between "
             "two adaptive runs. Ratios pair each finalist run with the geometric mean of its two adaptive neighbours; "
             "95% t intervals over those pairs; best fixed: the finalist of the highest mean over its bracketed runs "
             "(bench/adaptive.py live).\n",
             "Steady: the engine steps with every lane decoding and no prefill, read from the generations' token_s; "
             "steady tokens: the fewest any run of the cell had in those steps.\n",
             "| dataset | T | c | steady tok/s (adaptive) | best fixed | steady ratio [95%] | tok/s incl. prefill "
             "ratio [95%] | new tokens | steady tokens | measured |", "|---|---:|---:|---:|---|---|---|---:|---:|---|"]
    for c in cells:
        d, p = c["decode_tok_s"], c["tok_s"]
        tokens = np.mean([r["new_tokens"] for r in c["runs"][args.adaptive]])
        steady = min(r["steady_tokens"] for rs in c["runs"].values() for r in rs)
        lines.append(f"| {c['dataset']} | {c['temperature']:g} | {c['concurrency']} | "
                     f"{d['mean'][args.adaptive]:.2f} | {d['best_fixed']} (of {', '.join(c['finalists'])}) | {d['ratio']:.3f} [{d['lo']:.3f}, "
                     f"{d['hi']:.3f}] | {p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}] | {tokens:.0f} | {steady:.0f} | "
                     f"{measured(c)} |")
    guessed = [c for c in cells if "predicted" in c]
    if guessed:
        lines += ["", "## The simulator against these cells", "",
                  "`avkit simulate` of each cell's kept trace (its first fixed:<max K> run: the same prompts, every "
                  "slot labelled) at its concurrency, every policy, with the cost model named per row; ratio = "
                  "predicted / measured steady tok/s (goal: 0.90-1.10 in every cell).", "",
                  "| dataset | T | c | cost model | adaptive | best fixed | every policy: min-max | within 10% |",
                  "|---|---:|---:|---|---:|---:|---|---:|"]
        for c in guessed:
            r = {p: c["predicted"]["tok_s"][p] / c["decode_tok_s"]["mean"][p] for p in c["runs"]}
            lines.append(f"| {c['dataset']} | {c['temperature']:g} | {c['concurrency']} | `{c['predicted']['cost']}` "
                         f"| {r[args.adaptive]:.3f} | {r[c['decode_tok_s']['best_fixed']]:.3f} | "
                         f"{min(r.values()):.3f}-{max(r.values()):.3f} | "
                         f"{sum(0.9 <= v <= 1.1 for v in r.values())} of {len(r)} |")
        split = [c for c in guessed if "step_ms" in c["predicted"] and all("steady_steps" in r for rs in c["runs"].values()
                                                                          for r in rs)]
        if split:
            lines += ["", "Where each policy's error comes from: tok/s = tokens per request-step / step time, so "
                      "predicted / measured tok/s = (tokens per request-step ratio) / (step time ratio); measured "
                      "over the steady steps (c lanes, no prefill), the repeats' mean.", "",
                      "| dataset | T | c | policy | tokens / request-step: predicted / measured | step ms: predicted / "
                      "measured | their quotient |", "|---|---:|---:|---|---|---|---:|"]
            for c in split:
                for p, rs in c["runs"].items():
                    tokens = np.mean([r["steady_tokens"] / r["steady_steps"] / c["concurrency"] for r in rs])
                    ms = np.mean([1e3 * r["steady_tokens"] / r["decode_tok_s"] / r["steady_steps"] for r in rs])
                    pt, pm = c["predicted"]["tokens_per_step"][p], c["predicted"]["step_ms"][p]
                    lines.append(f"| {c['dataset']} | {c['temperature']:g} | {c['concurrency']} | {p} | {pt:.2f} / "
                                 f"{tokens:.2f} | {pm:.0f} / {ms:.0f} | {pt / tokens / (pm / ms):.3f} |")
    return "\n".join(lines) + "\n"


def predict(args, cells: list[dict]) -> None:
    """Each cell with a kept trace gets the simulator's tok/s per policy under --predict's cost model (in place):
    a cost file ({T}: one per temperature), `cell` (the model the cell's last adaptive run left) or `replay:PRIOR`
    (the model today's learner carries over the cell's kept adaptive steps from PRIOR: `carried`)."""
    from avkit.sim.replay import simulate  # the simulator, only for --predict
    from cost_cell import carried, read_steps

    for c in cells:
        trace = trace_path(args, c["dataset"], c["temperature"], c["concurrency"])
        if not trace.is_file():
            print(f"no kept trace for {c['dataset']} T={c['temperature']:g} c={c['concurrency']}: not predicted",
                  file=sys.stderr)
            continue
        cost = (str(learned_path(args, c["dataset"], c["temperature"], c["concurrency"])) if args.predict == "cell"
                else args.predict.removeprefix("replay:").replace("{T}", f"{c['temperature']:g}"))
        steps = trace.with_suffix(".steps.jsonl")
        if not Path(cost).is_file():
            raise SystemExit(f"adaptive.py live: error: --predict: no cost file {cost!r}")
        if args.predict.startswith("replay:") and not steps.is_file():
            raise SystemExit(f"adaptive.py live: error: --predict replay: no kept steps {str(steps)!r}")
        table = CostTable.load(cost)
        if args.predict.startswith("replay:"):  # today's learner over the cell's kept steps (bench/cost_cell.py)
            table = carried(table, read_steps(steps))
            cost = f"{steps} through today's learner, runs carried from {cost}"
        policies = list(c["runs"])
        df = simulate([str(trace)], table, [c["concurrency"]], policies,
                      coefficients=args.coefficients if Path(args.coefficients).is_file() else "")
        c["predicted"] = {"cost": cost, **{k: dict(zip(policies, df[col].to_list())) for k, col in
                                           (("tok_s", "throughput_tok_s"), ("tokens_per_step", "tokens_per_step"),
                                            ("step_ms", "step_ms"))}}


def measured(c: dict) -> str:
    """When, on which commit and under which load a cell ran (the mix: its cells')."""
    return f"{c['date']} {c['commit']}, load {c['load']:.1f}" if "date" in c else "its cells"


def tiny_setup(root: Path, args) -> None:
    """Tiny random models, a prompt file and a cost table in `root` (the --tiny mode)."""
    args.target, args.draft = tiny_pair("adaptive-live-")
    prompts = root / "tiny.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ("def add(a, b):", "Hello, world!", "for i in range(10):", "import numpy as np")))
    args.datasets, args.cost = [str(prompts)], str(CostTable((1, 8, 32), (1.0, 1.6, 4.0), (1, 8), (0.1, 0.3)).save(
        root / "cost.json"))


def live_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="adaptive.py live", description="live adaptive / best fixed K (bench/README.md)")
    options(ap, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, datasets=["humaneval", "sharegpt"], temperatures=[0.0, 1.0],
            concurrency=[1, 4, 16], ks=[0, 1, 2, 3, 5, 7], coefficients="traces/coefficients.json",
            max_new_tokens=256, seed=0, dtype="bfloat16", threads=2, tiny=False)
    ap.add_argument("--adaptive", default="adaptive-stop:online_logistic", help="the adaptive policy spec")
    ap.add_argument("--cost", default="", help="the adaptive policy's cost table (avkit profile)")
    ap.add_argument("--repeats", type=int, default=4, help="rounds after the screen: bracketed runs per finalist")
    ap.add_argument("--finalists", type=int, default=2, help="the fixed K of the best screen rates that go on")
    ap.add_argument("--keep", type=csv(int), default=[], metavar="K,...",
                    help="fixed K that go on whatever the screen says (a mix compares against a K that is a finalist "
                         "in each of its cells: `bench/adaptive.py mixed` names the one it predicts)")
    ap.add_argument("--requests-per-lane", type=int, default=2)
    ap.add_argument("--out", default="bench/results/adaptive_live.md", help="Markdown; the JSON goes beside it "
                    "(the cells measured so far: each new cell replaces the one of its dataset, T and c)")
    ap.add_argument("--resume", action="store_true", help="skip the cells the JSON already holds")
    ap.add_argument("--predict", default="", metavar="COST",
                    help="no runs: the simulator's tok/s for every held cell from its kept trace under this cost "
                         "model ({T}: one per temperature; 'cell': the model the cell's last adaptive run left; "
                         "'replay:COST': today's learner over the cell's kept steps from COST, `predict`), "
                         "beside the measured ones")
    ap.add_argument("--no-learn-cost", dest="learn_cost", action="store_false",
                    help="the adaptive policy keeps --cost as it is (default: it learns from its steps, as serve's)")
    ap.add_argument("--traces", default="bench/results/adaptive_live_traces",
                    help="where each cell's first fixed:<max K> trace is kept (the simulator's input; '' keeps none)")
    if "--tiny" in argv:  # small defaults: seconds, not hours
        ap.set_defaults(temperatures=[1.0], concurrency=[1, 2], ks=[0, 2], max_new_tokens=24, requests_per_lane=1, repeats=3,
                        out=str(Path(tempfile.gettempdir()) / "adaptive_live_tiny.md"), traces="")
    args = ap.parse_args(argv)
    args.argv = list(argv)
    if args.repeats < 3 and not args.tiny:
        ap.error("--repeats must be >= 3: an interval needs them")
    if args.finalists < 1:
        ap.error("--finalists must be >= 1")
    if set(args.keep) - set(args.ks):
        ap.error(f"--keep: {','.join(map(str, sorted(set(args.keep) - set(args.ks))))} not in --ks")
    out = Path(args.out)
    store = out.with_suffix(".json")
    policies = {f"fixed:{k}" for k in args.ks} | {args.adaptive}
    try:
        stored = [c for c in json.loads(store.read_text()) if c["concurrency"] != "mixed"] if store.is_file() else []
    except (ValueError, TypeError, KeyError) as e:
        raise SystemExit(f"adaptive.py live: error: {store}: not a cell store ({e})") from None
    # a cell of other policies or another protocol is kept in the store, measured anew, not shown
    held = [c for c in stored if set(c["runs"]) == policies and c.get("protocol") == PROTOCOL]
    args.kept_aside = [c for c in stored if not any(c is h for h in held)]
    cells = {key(c): c for c in held}
    if args.predict:
        args.coefficients = "" if args.tiny else args.coefficients  # tiny_setup's choice for the runs
        predict(args, held)
        print(save(args, out, held))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.tiny:
            tiny_setup(work, args)
            args.dtype, args.threads, args.coefficients = "float32", 1, ""
        for d in args.datasets:
            for t in args.temperatures:
                for c in args.concurrency:
                    if args.resume and (Path(d).name, t, c) in cells:
                        continue
                    new = cell(args, work, d, t, c)
                    cells[key(new)] = new
                    save(args, out, list(cells.values()))
    print(save(args, out, list(cells.values())))
    return 0


def save(args, out: Path, cells: list[dict]) -> str:
    """The store (every cell measured so far, then the mixes they make) and its Markdown, written together."""
    cells = cells + mixed(args, cells)
    text = markdown(args, cells)
    fresh = {(key(c), frozenset(c["runs"])) for c in cells}
    aside = [c for c in args.kept_aside if (key(c), frozenset(c["runs"])) not in fresh]  # an old protocol's
    write({out: text, out.with_suffix(".json"): cells + aside})
    return text
