"""A search's figure (tune.sh's search-<TASK>.png): every complete trial of every method at (its forgetting, its dev
metric), each method's front joined as a staircase, its picks ringed; one panel per method, on shared axes, with all
methods' fronts in grey behind each, so a method is read against the others. matplotlib is imported only here."""

import math
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


def plot(records: List[dict], chosen: Dict[str, List[dict]], methods: List[str], path: str, texts: dict):
    """Draw the figure at ``path``; None without matplotlib or without a complete trial."""
    plt = pyplot()
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    done = [r for r in records if r["state"] == "complete"]
    if not done:
        return None
    front_of = fronts(records)
    n = len(methods)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows + 0.9), sharex=True, sharey=True,
                             squeeze=False)
    xs, ys = [r["forgetting"] for r in done], [r["metric"] for r in done]
    pad_x, pad_y = 0.06 * ((max(xs) - min(xs)) or 1e-3), 0.06 * ((max(ys) - min(ys)) or 1.0)
    colour = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}
    for i, method in enumerate(methods):
        ax = axes[i // cols][i % cols]
        for other in methods:  # every front behind, for reference
            if other != method and front_of.get(other):
                ax.plot(*_staircase(front_of[other]), color="0.8", lw=1, zorder=1)
        mine = [r for r in done if r["method"] == method]
        ax.scatter([r["forgetting"] for r in mine], [r["metric"] for r in mine], s=18, color=colour[method],
                   alpha=0.6, zorder=2)
        if front_of.get(method):
            ax.plot(*_staircase(front_of[method]), color=colour[method], lw=1.6, zorder=3)
        picked = chosen.get(method, [])
        ax.scatter([r["forgetting"] for r in picked], [r["metric"] for r in picked], s=90, facecolors="none",
                   edgecolors="black", lw=1.2, zorder=4)
        c = counts(records, method)
        bad = c.get("failed", 0) + c.get("diverged", 0)
        ax.set_title(f"{method}: {c.get('complete', 0)} complete" + (f", {bad} failed" if bad else ""), fontsize=10)
        ax.set_xlim(min(xs) - pad_x, max(xs) + pad_x)
        ax.set_ylim(min(ys) - pad_y, max(ys) + pad_y)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))  # tiny forgetting: one ×10^k for the axis
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
    fig.legend(key, ["a trial (in its method's colour)", "the method's front", "picked: confirmed over seeds",
                     "the other methods' fronts"], loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(texts["title"], fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
