"""The report's matplotlib figures: each function takes plain arrays and returns a Figure.

Drawn on the object-oriented API (`matplotlib.figure.Figure`, Agg canvas): no pyplot state, safe to
build in any order. Every axis names its quantity and unit; every multi-series plot has a legend.
"""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

GRID = {"color": "#d9d9d9", "linewidth": 0.6}
ACCENT = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def new_figure(width: float = 7.5, height: float = 4.2, nrows: int = 1, ncols: int = 1, **kw):
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    for ax in axes.flat:
        ax.grid(True, **GRID)
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def plain_log(ax, axis: str = "both", base: int = 10) -> None:
    """Log scale with plain numbers (1,000 not 10^3) on the major ticks and 2 and 5 multiples."""
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    for name in ("x", "y") if axis == "both" else (axis,):
        a = getattr(ax, f"{name}axis")
        getattr(ax, f"set_{name}scale")("log", base=base)
        a.set_major_formatter(plain)
        if base == 10:
            a.set_minor_locator(LogLocator(10, subs=(2.0, 5.0)))
            a.set_minor_formatter(plain)
        else:
            a.set_minor_formatter(NullFormatter())


def series(rows, name: str, x: str, y: str, over: dict | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Result rows (dicts, in x order) -> row[name] -> (row[x] [C], row[y] [C], divided by over[row[x]] when
    given): one line per policy or arm."""
    out: dict[str, tuple[list, list]] = {}
    for r in rows:
        xs, ys = out.setdefault(r[name], ([], []))
        xs.append(r[x])
        ys.append(r[y] / (over[r[x]] if over else 1.0))
    return {key: (np.asarray(xs), np.asarray(ys)) for key, (xs, ys) in out.items()}


def series_colors(names: list[str]) -> dict[str, str]:
    """A stable color per series name (tab10 in order)."""
    cmap = colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def position_lines(curves: dict[str, tuple[np.ndarray, np.ndarray, dict]], k: int, size: tuple[float, float],
                   legend: int, band: np.ndarray | None = None, hline: float | None = None, **labels) -> Figure:
    """Lines over the draft positions: label -> (positions [P], values [P], its line style; color: tab10 in order
    unless given). `band` [P]: a half-width shaded around the first line; `hline`: a dotted reference level;
    `labels`: the axes' title, ylabel and limits."""
    fig, ax = new_figure(*size)
    ax = ax[0, 0]
    if band is not None:
        pos, rate, _ = next(iter(curves.values()))
        ax.fill_between(pos, np.clip(rate - band, 0, 1), np.clip(rate + band, 0, 1), color="black", alpha=0.12,
                        linewidth=0, label="95% interval")
    colors = series_colors(list(curves))
    for label, (pos, y, style) in curves.items():
        ax.plot(pos, y, label=label, **{"color": colors[label], **style})
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle=":")
    ax.set(xlabel="draft position i", xticks=range(k), **labels)
    ax.legend(frameon=False, fontsize=legend, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def reliability(panels: list[dict]) -> Figure:
    """panels: {title, pred [B], rate [B], count [B], ece}; bins with no slot are nan. Top row: the
    diagram (marker area ~ bin count); bottom row: slots per bin (log scale)."""
    n = len(panels)
    fig, axes = new_figure(3.6 * n + 0.4, 5.4, 2, n, height_ratios=(3, 1.2), sharex=True)
    for j, p in enumerate(panels):
        top, bottom = axes[0, j], axes[1, j]
        ok = p["count"] > 0
        color = ACCENT[j % len(ACCENT)]
        x, y, n = p["pred"][ok], p["rate"][ok], p["count"][ok]
        top.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfect calibration")
        top.errorbar(x, y, yerr=1.96 * np.sqrt(y * (1 - y) / n), color=color, linewidth=1.2, capsize=2,
                     label="observed, 95% interval", clip_on=False)
        top.scatter(x, y, s=20 + 180 * np.sqrt(n / n.max()), color=color, alpha=0.8, edgecolor="white",
                    label="bin (area ~ slots)", zorder=3, clip_on=False)  # the top bin sits at ~(1, 1)
        for xi, yi, ni in zip(x, y, n):
            top.annotate(f"{int(ni):,}", (xi, yi), textcoords="offset points", xytext=(5, -10), fontsize=6.5,
                         color="#444444")
        top.set(title=f"{p['title']}\nECE {p['ece']:.4f}", xlim=(0, 1.03), ylim=(0, 1.06), aspect="equal",
                ylabel="observed acceptance rate" if j == 0 else None)
        top.legend(frameon=False, fontsize=7, loc="upper left")
        width = 1.0 / len(p["count"])
        centers = (np.arange(len(p["count"])) + 0.5) * width
        bottom.bar(centers[ok], n, width=width * 0.9, color="#7f7f7f")
        bottom.set_yscale("log")
        bottom.set(xlabel="predicted acceptance probability", ylabel="slots per bin" if j == 0 else None,
                   ylim=(0.7, None))
    fig.suptitle("Reliability: predicted vs observed acceptance", fontsize=12)
    return fig


def coefficient_trajectory(x: np.ndarray, slope: np.ndarray, intercepts: np.ndarray, xlabel: str,
                           starts: list[tuple[float, str]] = ()) -> Figure:
    """x [R] increasing; slope [R]; intercepts [R, K] after each refit; starts: (x, name) where a later
    trace begins (a dashed line, named in the slope panel)."""
    fig, axes = new_figure(10.0, 3.8, 1, 2)
    a, b = axes[0, 0], axes[0, 1]
    for ax in (a, b):
        for xs, name in starts:
            ax.axvline(xs, color="#555555", linestyle="--", linewidth=0.9)
            if ax is a:
                ax.annotate(f"→ {name}", (xs, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -10),
                            textcoords="offset points", fontsize=7, color="#555555")
    a.plot(x, slope, color="black", linewidth=1.6)
    a.set(title="Slope ω after each refit", xlabel=xlabel, ylabel="ω (log-odds per feature unit)")
    cmap = colormaps["viridis"]
    k = intercepts.shape[1]
    for i in range(k):
        b.plot(x, intercepts[:, i], color=cmap(i / max(k - 1, 1)), linewidth=1.3, label=f"β{i}")
    b.set(title="Intercepts β_i after each refit", xlabel=xlabel, ylabel="β_i (log-odds)")
    b.legend(frameon=False, fontsize=7, ncols=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def _scatter_with_fit(ax, x, y, labels, r: float | None, title: str, ylabel: str):
    ax.scatter(x, y, s=60, color=ACCENT[0], zorder=3)
    for xi, yi, name in zip(x, y, labels):
        ax.annotate(name, (xi, yi), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if len(x) >= 2 and np.ptp(x) > 0:
        coef = np.polyfit(x, y, 1)
        xs = np.linspace(np.min(x), np.max(x), 20)
        ax.plot(xs, np.polyval(coef, xs), color="grey", linestyle="--", linewidth=1,
                label="least-squares line" + (f" (r = {r:+.2f})" if r is not None else ""))
        ax.legend(frameon=False, fontsize=8)
    ax.set(title=title, xlabel="mean draft entropy H(q) (nats)", ylabel=ylabel)


def role_analysis(entropy, slope, first_intercept, labels, r_slope, r_b0) -> Figure:
    """Per dataset: mean draft entropy [D] against the fitted slope [D] and first intercept [D]."""
    fig, axes = new_figure(10.0, 4.0, 1, 2)
    _scatter_with_fit(axes[0, 0], entropy, slope, labels, r_slope, "Slope per dataset", "slope ω")
    _scatter_with_fit(axes[0, 1], entropy, first_intercept, labels, r_b0, "First intercept per dataset",
                      "intercept β0 (log-odds)")
    return fig


def policy_style(policy: str, fixed_rank: float) -> dict:
    if policy.endswith("oracle"):  # reads the recorded outcomes: a bound, drawn as one
        return {"color": "#7f7f7f", "linestyle": "--", "marker": "", "linewidth": 1.2}
    if policy == "nospec":
        return {"color": "#7f7f7f", "linestyle": ":", "marker": "s", "linewidth": 1.8}
    if policy.startswith("fixed"):
        return {"color": colormaps["Blues"](0.35 + 0.6 * fixed_rank), "linestyle": "-", "marker": ".",
                "linewidth": 1.0}
    return {"linestyle": "-", "marker": "o", "linewidth": 2.2}


def _policy_lines(ax, series: dict[str, tuple[np.ndarray, np.ndarray]]):
    fixed = [p for p in series if p.startswith("fixed")]
    accents = iter(ACCENT)
    for policy, (x, y) in series.items():
        style = policy_style(policy, fixed.index(policy) / max(len(fixed) - 1, 1) if policy in fixed else 0.0)
        if "color" not in style:
            style["color"] = next(accents, "black")
        ax.plot(x, y, label=policy, **style)


def throughput_panels(size: tuple[float, float], series: dict[str, tuple[np.ndarray, np.ndarray]],
                      relative: dict[str, tuple[np.ndarray, np.ndarray]], xlabel: str, under=None):
    """Throughput over batch size, one line per policy or arm (log-log, left) and against the best fixed K (log x,
    right; no-spec is left out there: far below, it would flatten the rest). series, relative: name -> (x [C],
    y [C]); `under(ax)` draws beneath the lines of each panel. -> (figure, left axes, right axes)."""
    fig, axes = new_figure(*size, 1, 2)
    for ax, lines in ((axes[0, 0], series), (axes[0, 1], {p: v for p, v in relative.items() if p != "nospec"})):
        if under is not None:
            under(ax)
        _policy_lines(ax, lines)
        plain_log(ax, "x", base=2)
        ax.set_xlabel(xlabel)
    plain_log(axes[0, 0], "y")
    axes[0, 1].axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    return fig, axes[0, 0], axes[0, 1]


def pareto(series: dict[str, tuple[np.ndarray, np.ndarray]], front: tuple[np.ndarray, np.ndarray],
           concurrency: dict[str, np.ndarray] | None = None, annotate: str | None = None,
           bounds: frozenset[str] = frozenset()) -> Figure:
    """series: policy -> (per-request tok/s [C], throughput tok/s [C]); front: the Pareto points of the
    deployable policies; `bounds`: policies that are bounds, not deployable (the oracle), drawn dashed
    grey; `annotate`: a policy whose points are labelled with their concurrency."""
    fig, ax = new_figure(8.5, 4.8)
    ax = ax[0, 0]
    _policy_lines(ax, {p: v for p, v in series.items() if p not in bounds})
    for p in bounds & series.keys():
        ax.plot(*series[p], color="#7f7f7f", linestyle="--", linewidth=1.2, marker="",
                label=f"{p} (upper bound, not deployable)", zorder=1)
    order = np.argsort(front[0])
    ax.step(front[0][order], front[1][order], where="post", color="black", linewidth=1.2,
            label="Pareto front (deployable policies)", zorder=1)
    ax.scatter(front[0], front[1], s=110, facecolor="none", edgecolor="black", linewidth=1.0, zorder=4,
               label="on the front")
    if annotate in series and concurrency is not None:
        for x, y, c in zip(*series[annotate], concurrency[annotate]):
            ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=7)
    plain_log(ax)
    ax.set(title="Throughput–interactivity trade-off (one point per concurrency)",
           xlabel="interactivity (tokens/s per request)", ylabel="throughput (tokens/s, all requests)")
    ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def grouped_bars(values: dict[str, dict[str, float]], title: str, ylabel: str, baseline: float | None = None) -> Figure:
    """values: group (x tick) -> series (bar) -> value."""
    groups = list(values)
    series = list(dict.fromkeys(s for g in values.values() for s in g))
    colors = series_colors(series)
    fig, ax = new_figure(8.0, 3.9)
    ax = ax[0, 0]
    width = 0.8 / max(len(series), 1)
    for j, s in enumerate(series):
        x = np.arange(len(groups)) + (j - (len(series) - 1) / 2) * width
        ax.bar(x, [values[g].get(s, np.nan) for g in groups], width=width * 0.95, color=colors[s], label=s)
    if baseline is not None:
        ax.axhline(baseline, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set(title=title, ylabel=ylabel)
    ax.legend(frameon=False, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig
