"""`avkit simulate`'s terminal table: short policy names with a legend, and column groups that fit the
terminal, so no number is ever cut to "…" (at 80 columns the concurrencies wrap onto a second table).

Short names: no-spec; K1..K7 (fixed K); A = adaptive, A+stop = adaptive that also stops drafting
early, A-nogate = without the draft gate; the estimator after a colon, abbreviated (ol = online_logistic).
"""

from __future__ import annotations

import polars as pl
from rich import box
from rich.console import Console
from rich.table import Table

from avkit.sim.replay import deployable

ESTIMATOR_ABBREV = {"online_logistic": "ol", "per_position_slope": "pps", "batch_logistic": "bl"}


def short_policy(name: str) -> str:
    """A terminal-width name for a simulate policy.

    Examples
    --------
    >>> [short_policy(p) for p in ("nospec", "fixed7", "adaptive-online_logistic", "adaptive-stop-nogate-qmax")]
    ['no-spec', 'K7', 'A:ol', 'A+stop-nogate:qmax']
    """
    if name == "nospec":
        return "no-spec"
    if name.startswith("fixed"):
        return "K" + name[len("fixed"):]
    if not name.startswith("adaptive"):
        return name
    rest = name[len("adaptive"):]
    mode = ""
    for flag, short in (("-stop", "+stop"), ("-nogate", "-nogate")):
        if rest.startswith(flag):
            mode, rest = mode + short, rest[len(flag):]
    estimator = rest.lstrip("-")
    return f"A{mode}:{ESTIMATOR_ABBREV.get(estimator, estimator)}"


def _chunks(widths: list[int], first: int, room: int) -> list[list[int]]:
    """Split column indices into groups whose tables (first column + group) fit `room` characters."""
    groups, current, used = [], [], first
    for i, w in enumerate(widths):
        if current and used + w > room:
            groups.append(current)
            current, used = [], first
        current.append(i)
        used += w
    return groups + ([current] if current else [])


def render_results(df: pl.DataFrame, console: Console, title: str = "") -> None:
    """Throughput (tok/s) and × best fixed K per policy x concurrency; the best deployable of each column in bold."""
    conc = sorted(set(df["concurrency"].to_list()))
    policies = list(dict.fromkeys(df["policy"].to_list()))
    cell = {(r["policy"], r["concurrency"]): r for r in df.iter_rows(named=True)}
    runnable = df.filter(pl.Series(deployable(df)))  # the oracle is a bound, never "best"
    best = {c: runnable.filter(pl.col("concurrency") == c)["throughput_tok_s"].max() for c in conc}
    short = {p: short_policy(p) for p in policies}
    ratio = lambda x: "-" if x is None or x != x else f"{x:.2f}"  # no fixed K simulated: no ratio
    texts = {(p, c): f"{cell[p, c]['throughput_tok_s']:,.0f} ({ratio(cell[p, c]['vs_best_fixed'])})"
             for p in policies for c in conc if (p, c) in cell}
    pad = 3  # one space each side and a separator
    widths = [max(len(f"c={c}"), *(len(t) for (p, cc), t in texts.items() if cc == c)) + pad for c in conc]
    first = max(len("policy"), *map(len, short.values())) + pad
    for n, group in enumerate(_chunks(widths, first, max(console.width, 40))):
        table = Table(title=(title or "throughput, tokens/s (× best fixed K)") if n == 0 else None,
                      box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, title_justify="left")
        table.add_column("policy", no_wrap=True)
        for i in group:
            table.add_column(f"c={conc[i]}", justify="right", no_wrap=True)
        for p in policies:
            table.add_row(short[p], *(f"[bold]{texts[p, c]}[/]" if (p, c) in texts and cell[p, c]["throughput_tok_s"]
                                       == best[c] else texts.get((p, c), "-") for c in (conc[i] for i in group)))
        console.print(table)
    legend = [f"{s} = {p}" + (" (reads the outcomes: a bound, not deployable)" if p.endswith("-oracle") else "")
              for p, s in short.items() if s != p and not p.startswith("fixed") and p != "nospec"]
    fixed = [short[p] for p in policies if p.startswith("fixed")]
    if fixed:
        legend.insert(0, f"{fixed[0]}..{fixed[-1]} = fixed K" if len(fixed) > 1 else f"{fixed[0]} = fixed K")
    console.print("; ".join(legend) + ". Bold: the best deployable policy at that concurrency.", highlight=False)
