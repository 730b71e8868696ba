"""A search's figure (tune.sh's search-<TASK>.png): every complete trial of every method at (its forgetting, its dev
metric), each method's front joined as a staircase, its picks ringed; one panel per method, on shared axes, with all
methods' fronts in grey behind each, so a method is read against the others; outlying trials at the axis' edge
(:func:`x_range`). matplotlib is imported only here."""

import math
import statistics
from typing import Dict, List

from recadam_fairseq.engine.plot import PALETTE, pyplot
from recadam_fairseq.engine.trials import counts, fronts


def _staircase(front: List[dict]):
    """The front as the region it bounds: from the least forgetting (worst metric) to the best metric."""
    pts = sorted(front, key=lambda r: r["forgetting"])
    xs, ys = [], []
    for i, r in enumerate(pts):
        if i:
            xs.append(r["forgetting"])
            ys.append(pts[i - 1]["metric"])
        xs.append(r["forgetting"])
        ys.append(r["metric"])
    return xs, ys


def x_range(xs: List[float], front_xs: List[float]):
    """The forgetting axis: every trial's but the outliers above the boxplot's whisker (Q3 + 1.5 IQR; a diverging
    lr), which would squeeze the fronts into a corner and are drawn at the axis' edge. Every front point stays."""
    lo, hi = min(xs), max(xs)
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        fence = q3 + 1.5 * (q3 - q1)
        hi = max([x for x in xs if x <= fence] + front_xs)
    return lo, hi


def plot(records: List[dict], chosen: Dict[str, List[dict]], methods: List[str], path: str, texts: dict):
    """Draw the figure at ``path``; None without matplotlib or without a complete trial."""
    plt = pyplot()
    if plt is None:
        return None
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    done = [r for r in records if r["state"] == "complete"]
    if not done:
        return None
    front_of = fronts(records)
    n = len(methods)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    xs, ys = [r["forgetting"] for r in done], [r["metric"] for r in done]
    x_lo, x_hi = x_range(xs, [r["forgetting"] for f in front_of.values() for r in f])
    n_key = 4 + (max(xs) > x_hi)
    ncol = {1: 1, 2: 3}.get(cols, n_key)  # (the key's items that fit across the panels' width)
    key_h = 0.27 * math.ceil(n_key / ncol)  # inches
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows + 0.6 + key_h), sharex=True, sharey=True,
                             squeeze=False)
    pad_x, pad_y = 0.06 * ((x_hi - x_lo) or 1e-3), 0.06 * ((max(ys) - min(ys)) or 1.0)
    edge = x_hi + 0.5 * pad_x
    colour = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}
    for i, method in enumerate(methods):
        ax = axes[i // cols][i % cols]
        for other in methods:  # every front behind, for reference
            if other != method and front_of.get(other):
                ax.plot(*_staircase(front_of[other]), color="0.8", lw=1, zorder=1)
        mine = [r for r in done if r["method"] == method and r["forgetting"] <= x_hi]
        ax.scatter([r["forgetting"] for r in mine], [r["metric"] for r in mine], s=18, color=colour[method],
                   alpha=0.6, zorder=2)
        beyond = [r for r in done if r["method"] == method and r["forgetting"] > x_hi]
        ax.scatter([edge] * len(beyond), [r["metric"] for r in beyond], s=26, marker=">", color=colour[method],
                   alpha=0.6, zorder=2)
        if front_of.get(method):
            ax.plot(*_staircase(front_of[method]), color=colour[method], lw=1.6, zorder=3)
        picked = chosen.get(method, [])
        ax.scatter([r["forgetting"] for r in picked], [r["metric"] for r in picked], s=90, facecolors="none",
                   edgecolors="black", lw=1.2, zorder=4)
        c = counts(records, method)
        bad = c.get("failed", 0) + c.get("diverged", 0)
        ax.set_title(f"{method}: {c.get('complete', 0)} complete" + (f", {bad} failed" if bad else "")
                     + (f", {len(beyond)} beyond the axis" if beyond else ""), fontsize=10)
        ax.set_xlim(x_lo - pad_x, x_hi + pad_x)
        ax.set_ylim(min(ys) - pad_y, max(ys) + pad_y)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))  # (an offset ×10^k hits the label)
        if i % cols == 0:
            ax.set_ylabel(texts["y"])
        if i // cols == rows - 1 or i + cols >= n:
            ax.set_xlabel(texts["x"], fontsize=9)
            ax.tick_params(labelbottom=True)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    key = [plt.Line2D([], [], ls="", marker="o", ms=5, color="0.45", alpha=0.6),
           plt.Line2D([], [], color="0.45", lw=1.6),
           plt.Line2D([], [], ls="", marker="o", ms=10, mfc="none", mec="black"),
           plt.Line2D([], [], color="0.8", lw=1)]
    words = ["a trial (in its method's colour)", "the method's front", "picked: confirmed over seeds",
             "the other methods' fronts"]
    if max(xs) > x_hi:
        key.append(plt.Line2D([], [], ls="", marker=">", ms=6, color="0.45", alpha=0.6))
        words.append(f"a trial forgetting more than {x_hi:.3g}, at its accuracy")
    fig.legend(key, words, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(texts["title"], fontsize=11)
    fig.tight_layout(rect=(0, key_h / fig.get_figheight(), 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
