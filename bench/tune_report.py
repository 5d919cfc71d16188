"""The report of `bench/tune.py live`: bench/results/tune_live.md from tune_live.json: measured tokens/s per engine
x config x run, the tuned schedule against the best fixed K (no-spec counts as K = 0) and the batch sizes each run
visited. An engine whose schedule is speculation off everywhere has no "tuned" runs: its tuned config is no-spec,
judged against every speculative fixed K (bench/README.md: the glossary).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from avkit.markdown import md_table
from avkit.scheduling.batch_schedule import BatchSchedule
from common import write

# ---- its report -------------------------------------------------------------------------------------------
STEADY_MARGIN = 0.97  # tuned >= 0.97x the best fixed K at every steady concurrency


def rate(x: dict) -> float:
    """The rate that picks a config's median round (`_median`): a steady run's steady decode
    tok/s, else (the mixed run, or a run with no steady window) tokens/s including prefill."""
    steady = x.get("steady_tok_s")
    return steady if steady is not None and steady == steady else x["tok_s"]


def _middle(x: dict, field: str) -> float | None:
    """The lower-middle round's ``field`` over the row's repeated rounds (the row's own value if it has
    none); None when no round has it (no steady window)."""
    vals = sorted(v for v in (y.get(field) for y in x.get("repeats") or [x]) if v is not None and v == v)
    return vals[(len(vals) - 1) // 2] if vals else None


def whole(x: dict) -> float:
    """Tokens/s of the whole run, both models' prefills included: what the verdicts compare."""
    return _middle(x, "tok_s")


def steady(x: dict) -> float | None:
    """Steady decode tok/s (every lane past prefill, none finished): the state `avkit tune` predicts."""
    return _middle(x, "steady_tok_s")


def _share_by_range(in_flight: list[int], schedule: list[list[int]]) -> str:
    """Share of engine steps per schedule range (past the last range counts in it)."""
    b = np.asarray(in_flight)  # [steps] batch size at each engine step
    tops = [hi for _, hi, _ in schedule[:-1]] + [np.inf]
    return ", ".join(f"{lo}-{hi} (K={k}): {100 * ((b >= lo) & (b <= top)).sum() / b.size:.0f}%"
                     for (lo, hi, k), top in zip(schedule, tops)) if b.size else "-"


def _greedy(rows: dict, engine: str, config: str, run: str) -> str:
    base, got = rows.get((engine, "nospec", run)), rows.get((engine, config, run))
    if config == "nospec" or base is None or got is None:
        return ""
    bad = sum(a != b for a, b in zip(base["outputs"], got["outputs"]))
    return "" if not bad else f" ({bad}≠)"


def _runs(data: dict) -> list[str]:
    """The plan's run names in reading order: steady runs by concurrency, then the mixed run."""
    return sorted((r["name"] for r in data["plan"]),
                  key=lambda n: (n == "mixed", int(m.group(1)) if (m := re.match(r"c=(\d+)", n)) else 0, n))


def _off(data: dict, engine: str) -> bool:
    """The engine's schedule is speculation off at every batch size: its tuned config is no-spec."""
    return all(k == 0 for _, _, k in data["schedules"][engine]["ranges"])


def _k_at(ranges: list[list[int]], b: int) -> int:
    """K of the schedule `ranges` at batch size b (`BatchSchedule.k_at`: past the last range, the last K)."""
    return BatchSchedule(tuple(map(tuple, ranges))).k_at(b)


def ran(data: dict, engine: str, x: dict) -> list[list[int]]:
    """The schedule a tuned row ran: its piece's; for rows from before pieces were recorded on rows, the
    engine's first piece's (every avkit piece before rows named their piece ran the same schedule)."""
    pieces = [p for p in data["pieces"] if engine in p.get("schedules", {})]
    own = next((p for p in pieces if p["utc"] == x.get("piece")), pieces[0] if pieces else None)
    return own["schedules"][engine]["ranges"] if own else data["schedules"][engine]["ranges"]


def _visited(x: dict) -> set[int]:
    return {b for y in (x.get("repeats") or [x]) for b in y.get("in_flight", x.get("in_flight", [])) if b > 0}


def stale(data: dict, engine: str, x: dict) -> str:
    """'' when the tuned row ran the current schedule, or an earlier one with the same K at every batch size
    it visited (the same decisions); else a note naming the schedule it ran."""
    old, now = ran(data, engine, x), data["schedules"][engine]["ranges"]
    if old == now:
        return ""
    if all(_k_at(old, b) == _k_at(now, b) for b in _visited(x)):
        return f" (ran the earlier schedule {old}: the same K at every batch size it visited)"
    return f"ran the earlier schedule {old}, a different K at batch sizes it visited"


def drafted_nowhere(data: dict, engine: str, x: dict) -> bool:
    """The tuned row drafted at no step of its run: the drafter's forward time was 0 in every round, or, for
    rows from before that was recorded, every batch size the run visited is in a K = 0 range of the schedule
    it ran."""
    rounds = x.get("repeats") or [x]
    if all("draft_forward_s" in y for y in rounds):
        return all(y["draft_forward_s"] == 0 for y in rounds)
    return all(_k_at(ran(data, engine, x), b) == 0 for b in x["in_flight"] if b > 0)


OLD_MACHINE = "the AVX2 box"  # every piece before machines were recorded ran there


def row_machine(data: dict, x: dict) -> str:
    """The machine a row was measured on: its piece's record (common.py `machine()`)."""
    meta = next((p for p in data["pieces"] if x.get("piece") is not None and p["utc"] == x["piece"]), {})
    return meta.get("machine", OLD_MACHINE)


def judged(data: dict, rows: dict, engine: str, run: str) -> tuple[dict | None, dict, str]:
    """(the tuned side, the fixed configs it is judged against, how the tuned side was formed). A schedule
    that is off everywhere is no-spec (vs every speculative K). A tuned run that drafted at no step did
    no-spec's work, forward for forward: its rounds and no-spec's measure one thing, so they are pooled
    (each rate the lower middle of both configs' rounds) and judged against every speculative K. Rows
    measured on another machine than the tuned side are left out (a different CPU is not noise)."""
    side = rows.get((engine, "nospec" if _off(data, engine) else "tuned", run))
    here = {k: x for k, x in rows.items() if side is None or row_machine(data, x) == row_machine(data, side)}
    others = {c: x for (e, c, r), x in here.items() if e == engine and r == run and c not in ("tuned", "nospec")}
    nospec = here.get((engine, "nospec", run))
    if _off(data, engine):
        return nospec, others, " (= nospec)"
    tuned = here.get((engine, "tuned", run))
    if tuned is not None and nospec is not None and drafted_nowhere(data, engine, tuned):
        pool = (tuned.get("repeats") or [tuned]) + (nospec.get("repeats") or [nospec])
        return ({**tuned, "repeats": pool}, others,
                f" (drafted at no step: no-spec's work; its and no-spec's {len(pool)} rounds pooled)")
    return tuned, {**others, **({"nospec": nospec} if nospec is not None else {})}, ""


def meets(tuned: dict, fixed: dict, mixed: bool) -> tuple[bool, str, float]:
    """The goal on tokens/s incl. prefill -> (met, the best fixed config, tuned / it): on `mixed` ahead of
    every fixed config, on a steady run >= STEADY_MARGIN x the best."""
    rate = {c: whole(x) for c, x in fixed.items()}
    best = max(rate, key=rate.get)
    ok = all(whole(tuned) > v for v in rate.values()) if mixed else whole(tuned) / rate[best] >= STEADY_MARGIN
    return ok, best, whole(tuned) / rate[best]


def verdicts(data: dict) -> list[str]:
    """Per engine: tuned vs the best fixed config at each steady run, and vs every fixed config on `mixed`,
    on the whole run's tokens/s (prefills included: the schedule's catch-up rule trades drafting for the
    drafter's prefill, which a decode-only window does not see); steady runs also compare steady decode."""
    rows = {(x["engine"], x["config"], x["run"]): x for x in data["rows"] if "tok_s" in x}
    lines = []
    for engine in dict.fromkeys(x["engine"] for x in data["rows"]):
        for run in _runs(data):
            tuned, others, how = judged(data, rows, engine, run)
            speculative = "speculative " if how else ""
            if tuned is None or not others:
                lines.append(f"- {engine} {run}: not measured (tuned or every fixed config missing)")
                continue
            old = "" if _off(data, engine) else stale(data, engine, rows[engine, "tuned", run])
            if old and not old.startswith(" "):
                lines.append(f"- {engine} {run}: not judged: its tuned row {old} (not re-measured)")
                continue
            how += old
            ok, best, ratio = meets(tuned, others, run == "mixed")
            goal = "ahead of every fixed config" if run == "mixed" else f">= {STEADY_MARGIN}x the best fixed config"
            line = (f"- {engine} {run}: tuned{how} {whole(tuned):.2f} tok/s incl. prefill = "
                    f"{ratio:.3f}x the best {speculative}fixed "
                    f"({best}, {whole(others[best]):.2f}; {len(others)} fixed config{'s' * (len(others) != 1)} "
                    "measured): "
                    f"{'meets' if ok else 'MISSES'} the goal ({goal})")
            dec = {c: steady(x) for c, x in others.items() if steady(x) is not None}
            if run != "mixed" and steady(tuned) is not None and dec:  # decode only, the tuner's state
                top = max(dec, key=dec.get)
                r2 = steady(tuned) / dec[top]
                line += (f"; steady decode {steady(tuned):.2f} tok/s = {r2:.3f}x the best ({top}, {dec[top]:.2f}; "
                         f"{len(dec)} with a window): {'meets' if r2 >= STEADY_MARGIN else 'misses'}")
            lines.append(line + _pieces(tuned, others, run == "mixed"))
    return lines


def _pieces(tuned: dict, others: dict, mixed: bool) -> str:
    """Where the verdict's rows come from: a box's speed drifts between invocations (pieces) by more than
    the margin, so a verdict across pieces is flagged and, where the tuned row's own piece measured fixed
    configs too, that piece's verdict is given beside it."""
    piece = tuned.get("piece")
    pieces = {x.get("piece") for x in (tuned, *others.values())}
    if len(pieces) == 1:  # one piece, or rows from before pieces were recorded
        return ""
    same = {c: x for c, x in others.items() if piece is not None and x.get("piece") == piece}
    unknown = " (some unrecorded)" if None in pieces else ""
    note = f" [rows from {len(pieces)} pieces (invocations){unknown}"
    if not same:
        return note + ": no fixed config shares the tuned row's piece]"
    ok, best, ratio = meets(tuned, same, mixed)
    return (note + f"; within the tuned row's piece: {ratio:.3f}x the best of "
            f"{len(same)} ({best}, {whole(same[best]):.2f}): {'meets' if ok else 'misses'}]")


def tables(data: dict) -> list[str]:
    rows = {(x["engine"], x["config"], x["run"]): x for x in data["rows"] if "tok_s" in x}
    runs = _runs(data)
    out = []
    for engine in dict.fromkeys(x["engine"] for x in data["rows"]):
        cfgs = list(dict.fromkeys(c for e, c, _ in rows if e == engine))
        cfgs.sort(key=lambda c: (c == "tuned", c != "nospec", int(c[2:]) if c.startswith("K=") else 0))
        out += [f"### {engine}", "", "Cells: tok/s incl. prefill / steady decode tok/s (steady runs), each the "
                "median round. The last column compares what the verdicts compare (tok/s incl. prefill; a tuned run "
                "that drafted at no step pools its rounds with no-spec's).", ""]
        body = []
        for run in runs:
            cells = []
            for c in cfgs:
                x = rows.get((engine, c, run))
                dec = "" if x is None or steady(x) is None else f" / {steady(x):.2f}"
                cells.append("-" if x is None else f"{whole(x):.2f}{dec}{_greedy(rows, engine, c, run)}")
            t, vs, _ = judged(data, rows, engine, run)
            fixed = [whole(x) for x in vs.values()]
            ratio = f"{whole(t) / max(fixed):.3f}x" if t is not None and fixed else "-"
            if (engine, "tuned", run) in rows and (old := stale(data, engine, rows[engine, "tuned", run])):
                ratio += "" if old.startswith(" ") else " (earlier schedule)"
            body.append([run, *cells, ratio])
        out += [md_table(["run", *cfgs, "tuned / best fixed"], body), "", "Load (`uptime` at the start of each run):", ""]
        for (e, c, r), x in rows.items():
            if e == engine:
                extra = f", vLLM startup {x['startup_s']:.0f} s" if "startup_s" in x else ""
                if len(x.get("repeats", [])) > 1:  # the median round is the row; every round's rate
                    extra += "; rounds " + ", ".join(f"{rate(y):.2f}" for y in x["repeats"]) + " (median kept)"
                    extra += ", outputs differ between rounds" if x.get("outputs_vary") else ""
                out.append(f"- {c} {r}: {x['uptime']}; {x['tokens']} tokens in {x['wall_s']:.1f} s{extra}")
        errors = [x for x in data["rows"] if x["engine"] == engine and "error" in x]
        for x in errors:
            out += ["", f"{engine} {x['config']} failed:", "", "```", x["error"].strip()[-2500:], "```"]
        out.append("")
    return out


def write_report(data: dict, path: Path) -> str:
    schedules = data["schedules"]
    mixed = next((r for r in data["plan"] if r["name"] == "mixed"), None)
    visits = []
    for x in data["rows"]:
        if x.get("run") == "mixed" and x.get("config") == ("nospec" if _off(data, x["engine"]) else "tuned"):
            visits.append(f"- {x['engine']} tuned, steps per batch-size range: "
                          f"{_share_by_range(x['in_flight'], ran(data, x['engine'], x))}")
    piece_lines = [f"- `{' '.join(p['argv'])}` ({p['utc']}, {p.get('machine', OLD_MACHINE)}; {p['uptime_start']} "
                   "at the start)" for p in data["pieces"]]
    body = [
        "# The tuned schedule on real engines", "",
        "Schedules (batch size: K; beyond the last range the last K holds, vLLM's rule), each engine's own "
        "(`avkit tune` on its trace with its profiled cost table):", "",
        *(f"- {e} (`{os.path.relpath(s['file']) if os.path.isabs(s['file']) else s['file']}`): " + ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in s["ranges"])
          + (" — speculation off: the tuned config is no-spec" if _off(data, e) else "")
          for e, s in schedules.items()), "",
        "Runs (bench/README.md, the glossary): " + "; ".join(
            f"{r['name']}: {len(r['prompts'])} requests, new tokens {min(r['max_new'])}-{max(r['max_new'])}, "
            f"arrivals at output tokens {sorted(set(r['arrival_tokens']))}" for r in data["plan"]) + ".",
        "Cells: tokens/s (generated tokens / wall time, prefill included); (n≠): n outputs differ from the "
        "same engine's no-spec outputs at T = 0.", "",
        "## Verdicts", "", *verdicts(data), "", *(["## Notes", "", *(f"- {n}" for n in data["notes"]), ""] if data.get("notes") else []),
        "## Measured", "", *tables(data),
        "## Batch sizes visited by the mixed run", "", *(visits or ["- (no tuned mixed run yet)"]), "",
        f"Mixed run's requests: {len(mixed['prompts']) if mixed else 0}.", "",
        "## Commands (one piece each; `uptime` load at its start)", "", *piece_lines, ""]
    text = "\n".join(body)
    write({path: text})
    return text


