"""Tokens/s as people read them, and an `avkit tune` result as text (its table and summary lines): for the
`avkit tune` table, the report's tune section and bench/ (light on purpose: no numpy, torch or matplotlib)."""

from __future__ import annotations


def tok(x: float) -> str:
    """Tokens/s for people: whole numbers from 100 up, one decimal below (a CPU's 4.2 tok/s).

    >>> tok(1234.6), tok(4.24)
    ('1,235', '4.2')
    """
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def cell_text(row: dict | None) -> str:
    """A predicted `avkit tune` cell: throughput (interval), " >slo" when its p90 TPOT is over the SLO."""
    if row is None:
        return "-"
    text = f"{tok(row['throughput_tok_s'])} ({tok(row['lo'])}-{tok(row['hi'])})"
    return text if row["meets_slo"] else text + " >slo"


def tune_grid(result: dict) -> tuple[list[str], list[list[tuple[str, bool]]]]:
    """An `avkit tune` result's table: the column heads (arm, each concurrency, each infeasible one) and per
    arm its cells as (text, recommended)."""
    conc = result["concurrency"]
    cells = {(r["arm"], r["concurrency"]): r for r in result["cells"]}
    chosen = {(r["arm"], r["concurrency"]) for r in result["schedule"]["per_concurrency"]}
    heads = ["arm", *(f"c={c}" for c in conc), *(f"c={r['concurrency']}" for r in result["infeasible"])]
    rows = [[(arm, False), *((cell_text(cells.get((arm, c))), (arm, c) in chosen) for c in conc),
             *(("infeasible (KV)", False) for _ in result["infeasible"])]
            for arm in dict.fromkeys(r["arm"] for r in result["cells"])]
    return heads, rows


def change_lines(result: dict) -> list[str]:
    """One line per concurrency whose recommended K depends on the context band (none: one line saying so)."""
    s = result["schedule"]
    if "context_ranges" not in s:
        return []
    bands = [f"{lo}-{hi}" for lo, hi, _ in s["context_ranges"]]
    if not s["context_changes"]:
        return [f"context bands {', '.join(bands)} tokens: the same K at every concurrency"]
    return [f"  c={ch['concurrency']}: K " + ", ".join(f"{k if k is not None else 'infeasible'} at {b} tokens"
                                                     for k, b in zip(ch["k_by_band"], bands))
            for ch in s["context_changes"]]


def gain(ratio: float) -> str:
    """What a throughput ratio does, in words that follow its value as printed (3 decimals)."""
    shown = round(ratio, 3)
    verb = "it gains" if shown > 1 else "it loses" if shown < 1 else "it neither gains nor loses"
    return f"{verb}: {ratio:.3f}x"


def headline(result: dict) -> list[str]:
    """The recommended schedule, adaptive verification on or off (its gain at the same K), the overall gains."""
    s = result["schedule"]
    ranges = ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in s["ranges"])
    return [f"schedule (batch size: K): {ranges}; adaptive verification: {'on' if s['adaptive'] else 'off'} "
            f"(at the same K {gain(s['adaptive_geomean_gain'])} on geometric mean)",
            f"overall (geometric mean over concurrencies): {s['geomean_vs_single_k']:.3f}x the best single "
            f"fixed K (K={s['single_k']}), {s['geomean_vs_nospec']:.3f}x no-spec"]


def idle_lines(result: dict) -> list[str]:
    """Idle speculation's cost per concurrency where the schedule turns it off, and what is not priced."""
    idle = result["idle"]["per_concurrency"]
    return [f"speculation configured but off at c={r['concurrency']}: at most {100 * r['overhead_share']:.1f}% of "
            f"no-spec time (drafter prefill <= {100 * r['prefill_share']:.1f}%; keeping the drafter in sync "
            f"{100 * r['sync_share']:.1f}% per step, or catching up <= {100 * r['catch_up_share']['64']:.1f}% after "
            "a 64-step pause)" for r in idle] + (
        ["not priced: " + "; ".join(result["idle"]["not_priced"])] if idle else [])


def summary_lines(result: dict) -> list[str]:
    """The schedule, its gains per concurrency with intervals, the SLO, idle speculation's cost and notes."""
    s = result["schedule"]
    lines = headline(result)
    for r in s["per_concurrency"]:
        a, b = r["vs_single_k"], r["vs_nospec"]
        lines.append(f"  c={r['concurrency']}: {r['arm']} {tok(r['throughput_tok_s'])} tok/s; "
                     f"vs fixed K={s['single_k']} everywhere {a['ratio']:.3f}x [{a['lo']:.3f}, {a['hi']:.3f}], "
                     f"vs no-spec {b['ratio']:.3f}x [{b['lo']:.3f}, {b['hi']:.3f}]"
                     + ("" if r["meets_slo"] else "  (no arm meets the TPOT SLO)"))
    stop = ", ".join(f"c{r['concurrency']} {r['stop_vs_recommended']['ratio']:.3f}x" for r in s["per_concurrency"])
    lines.append(f"avkit's engine (adaptive with early stop, K={result['max_k']}) vs this schedule: {stop}")
    if result["slo"]["tpot_ms"] > 0:
        unmet = result["slo"]["unmet"]
        lines.append(f"p90 TPOT SLO {result['slo']['tpot_ms']:g} ms: "
                     + (f"cannot be met at c={unmet}" if unmet else "met at every feasible concurrency"))
    return (lines + [f"  {line}" for line in idle_lines(result)] + change_lines(result)
            + [f"note: {n}" for n in result["notes"]])


__all__ = ["cell_text", "change_lines", "gain", "headline", "idle_lines", "summary_lines", "tok", "tune_grid"]
