"""Tuning: the recommended K per batch-size range and whether adaptive verification is on, drawn on the
predicted throughput of every arm, from `avkit tune` results (reports/tune.json, avkit/tune/).

Left out (with a note) when no tune result exists.
"""

from __future__ import annotations

import json

import numpy as np

from avkit.markdown import DIGITS
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, record_table
from avkit.report.inputs import ReportInputs
from avkit.throughput_text import headline, idle_lines, tok, tune_grid


def schedule_table(result: dict) -> Table:
    """One row per simulated concurrency: the chosen arm, its throughput and the gains with intervals."""
    ratio = lambda key: lambda r: f"{r[key]['ratio']:.3f} [{r[key]['lo']:.3f}, {r[key]['hi']:.3f}]"
    cols = (("concurrency", "concurrency", DIGITS), ("recommended", "arm", None),
            ("tok/s", lambda r: tok(r["throughput_tok_s"]), None),
            (f"× fixed K={result['schedule']['single_k']} everywhere", ratio("vs_single_k"), None),
            ("× no-spec", ratio("vs_nospec"), None), ("meets SLO", "meets_slo", DIGITS))
    return record_table(result["schedule"]["per_concurrency"], cols, numeric=(True, False, True, True, True, False),
                        caption="The recommended arm per simulated concurrency; ratios with their bootstrap intervals "
                                "(paired: the same resampled requests on both sides).")


def cell_table(result: dict) -> Table:
    heads, rows = tune_grid(result)
    bold = frozenset((i, j) for i, row in enumerate(rows) for j, (_, chosen) in enumerate(row) if chosen)
    return Table(tuple(heads), [tuple(text for text, _ in row) for row in rows], emphasis=bold, collapsed=True,
                 caption="Predicted tokens/s per arm (bootstrap interval); bold: recommended; >slo: p90 TPOT over "
                         "the SLO.")


def schedule_figure(result: dict):
    """Every arm's tok/s over batch size with the schedule's ranges shaded and the infeasible concurrencies hatched
    (left); the same over the best single fixed K, the schedule with its bootstrap interval (right)."""
    s, per = result["schedule"], result["schedule"]["per_concurrency"]
    base = {r["concurrency"]: r["throughput_tok_s"] for r in result["cells"] if r["arm"] == f"fixed{s['single_k']}"}
    c = np.asarray([r["concurrency"] for r in per])  # [C]
    ratio, lo, hi = (np.asarray([r["vs_single_k"][key] for r in per]) for key in ("ratio", "lo", "hi"))  # [C]

    def under(ax):
        for i, (a, b, k) in enumerate(s["ranges"]):
            ax.axvspan(max(a, 0.75) if i == 0 else a - 0.5, b + 0.5, color="#f2f2f2" if i % 2 else "#e4ecf7", zorder=0)
            ax.text(np.sqrt(max(a, 1) * b), 0.02, f"K={k}" + (" +AV" if s["adaptive"] and k else ""), ha="center",
                    transform=ax.get_xaxis_transform(), va="bottom", fontsize=8, fontweight="bold")
        for r in result["infeasible"]:
            ax.axvspan(r["concurrency"] / 1.3, r["concurrency"] * 1.3, facecolor="none", hatch="//",
                       edgecolor="#c44e52", linewidth=0, zorder=0)
    fig, left, right = plots.throughput_panels(
        (12.0, 4.8), plots.series(result["cells"], "arm", "concurrency", "throughput_tok_s"),
        plots.series(result["cells"], "arm", "concurrency", "throughput_tok_s", base),
        "batch size (requests decoding at once)", under)
    left.plot(c, [r["throughput_tok_s"] for r in per], color="black", linewidth=3.0, marker="D",
              label="recommended schedule", zorder=5)
    left.set(title="Predicted throughput; shaded: the schedule's ranges", ylabel="throughput (tokens/s, all requests)")
    right.errorbar(c, ratio, yerr=[ratio - lo, hi - ratio], color="black", linewidth=2.5, marker="D", capsize=3,
                   label="recommended schedule", zorder=5)
    right.set(title="Relative to the best single fixed K (bootstrap interval)",
              ylabel="throughput / best single K (×)")
    right.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def build(inputs: ReportInputs) -> Section:
    sec, result = Section("tune", "Tuning: K per batch size, adaptive verification on or off"), inputs.tune
    if result is None:
        return sec.omit(inputs.notes.get("tune", "no `avkit tune` result"))
    cost = result["cost"]
    sec.add(f"Source: {inputs.sources.get('tune', '?')} ({result['requests']} recorded requests; cost "
            f"{cost.get('source', '?')} {cost.get('device', '')} {cost.get('target', '')}). Recommended "
            f"{'; '.join(headline(result))}.")
    if result["infeasible"]:
        sec.add(f"Not simulated, the KV cache does not hold them at {result['memory']['context']} tokens per "
                f"request: c = {', '.join(str(r['concurrency']) for r in result['infeasible'])} (at most "
                f"{result['memory']['max_concurrency']} requests fit).")
    sec.add(Figure("tune_schedule", "Predicted throughput of every arm against batch size, the recommended schedule "
                   "in black over its shaded ranges (left); the same against the best single fixed K, the schedule "
                   "with its bootstrap interval (right). Hatched: concurrencies that do not fit the KV cache.",
                   schedule_figure(result), alt="throughput vs batch size with the recommended schedule"))
    sec.add(schedule_table(result), cell_table(result))
    sec.add("vLLM `speculative_config`: `" + json.dumps(result["vllm"]) + "`; TensorRT-LLM: `"
            + json.dumps(result["trtllm"]) + "`.")
    sec.add(*(f"{line[0].upper()}{line[1:]}." for line in idle_lines(result)))
    return sec.add(*(f"Note: {n}." for n in result["notes"]))
