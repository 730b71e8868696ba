"""The figures: a task's accuracy against forgetting (each method's frontier, the WiSE-FT curves, Adam along
its runs) and the summary's gaps to Adam on every task. matplotlib is imported only here, when drawing."""

from recadam_fairseq.compare import methods
from recadam_fairseq.compare.methods import fmt

# the plot's main panel leaves out settings below this (near chance: 0.5) when most settings are above it
CHART_MIN_ACCURACY = 0.6


def chart_limits(rows):
    """The main panel's (xlim, ylim) (x = −forgetting, y = target accuracy) and the final settings
    listed beside it instead of drawn in it. Settings that ended near chance (accuracy below
    CHART_MIN_ACCURACY: a diverged run) would squeeze the rest into a corner: they are listed apart
    when the settings above the threshold outnumber them, and the limits fit the points above it
    (WiSE-FT points included; a curve that goes below is cut at the edge).
    Otherwise (a short smoke run, where most or all are near chance) every point and its error bars
    is on the chart. None for no rows."""
    final = [r for r in rows if not r.get("stopped_at")]
    off = [r for r in final if r["target_accuracy"] < CHART_MIN_ACCURACY]
    wise = [p for r in final for p in r.get("interpolated", [])]
    rows = rows + wise  # the WiSE-FT curves' points too
    if off and len(final) - len(off) > len(off):
        shown = [r for r in rows if r["target_accuracy"] >= CHART_MIN_ACCURACY]
        xs, ys = [-r["forgetting"] for r in shown], [r["target_accuracy"] for r in shown]
        x_lo, x_hi, y_lo, y_hi = min(xs), max(xs), min(ys), max(ys)
    elif rows:
        off = []
        x_lo = min(-r["forgetting"] - (r["forgetting_std"] or 0) for r in rows)
        x_hi = max(-r["forgetting"] + (r["forgetting_std"] or 0) for r in rows)
        y_lo = min(r["target_accuracy"] - (r["target_accuracy_std"] or 0) for r in rows)
        y_hi = max(r["target_accuracy"] + (r["target_accuracy_std"] or 0) for r in rows)
    else:
        return None, None, []
    if wise:  # the curves head for θ* at x = 0
        x_lo, x_hi = min(x_lo, 0.0), max(x_hi, 0.0)
    pad_x, pad_y = 0.05 * (x_hi - x_lo or 0.01), 0.05 * (y_hi - y_lo or 0.01)
    return (x_lo - pad_x, x_hi + 2 * pad_x), (y_lo - pad_y, y_hi + pad_y), off  # room for the labels on the right


def plot(rows, base, out, updates):
    """The figure at ``out``; returns the main panel's (xlim, ylim) (None without matplotlib: the GPU
    machine's image may lack it; --report-only draws it later)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its import logs at DEBUG when the root does
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 7), gridspec_kw={"width_ratios": [2.4, 1]})
    final = [r for r in rows if not r.get("stopped_at")]
    cmap = plt.get_cmap("tab20")
    markers = "osD^v<>pPX*h"
    for i, m in enumerate(dict.fromkeys(methods.group(r) for r in final)):
        rs = [r for r in final if methods.group(r) == m]
        color = "black" if m == "adam" else cmap((2 * i) % 20 + (2 * i) // 20 % 2)  # the darker of each pair first
        for r in rs:
            ax1.errorbar(-r["forgetting"], r["target_accuracy"], xerr=r["forgetting_std"], yerr=r["target_accuracy_std"],
                         fmt=markers[i % len(markers)], color=color, ms=6, capsize=2, alpha=0.9,
                         label=m if r is rs[0] else None)
            if len(rs) > 1:
                ax1.annotate(methods.knob_text(r), (-r["forgetting"], r["target_accuracy"]), fontsize=6,
                             color=color, xytext=(3, 3), textcoords="offset points")
        front = sorted((r for r in rs if r["method_frontier"]), key=lambda r: -r["forgetting"])
        if len(front) > 1:
            ax1.plot([-r["forgetting"] for r in front], [r["target_accuracy"] for r in front], color=color, lw=1)
        for r in rs:  # WiSE-FT: from the smallest α measured to the run itself (α = 1)
            pts = r.get("interpolated", []) + [r]
            if len(pts) > 1:
                ax1.plot([-p["forgetting"] for p in pts], [p["target_accuracy"] for p in pts], color=color, ls=":",
                         lw=1, marker="x", ms=3, alpha=0.8)
    wise = [p["alpha"] for r in final for p in r.get("interpolated", [])]
    if wise:  # θ* (α = 0) forgets nothing but has no head of its own for the target: its line, no point
        ax1.axvline(0, color="grey", lw=0.8, ls="-.", alpha=0.6, label="θ* (α = 0): no forgetting")
        ax1.plot([], [], color="black", ls=":", marker="x", ms=3,
                 label="WiSE-FT (1 − α)·θ* + α·θ, α = " + ", ".join(map(fmt, sorted(set(wise)))) + ", 1")
    adam = [r for r in rows if r["method"] == "adam"]
    if len(adam) > 1:  # Adam's own run, stopped earlier
        pts = sorted(adam, key=lambda r: r.get("stopped_at") or 1e9)
        ax1.plot([-r["forgetting"] for r in pts], [r["target_accuracy"] for r in pts], color="grey", ls=":",
                 marker=".", label="adam, the same runs after " + ", ".join(str(r["stopped_at"]) for r in pts[:-1])
                 + " updates")
    front = sorted((r for r in final if r["frontier"]), key=lambda r: -r["forgetting"])
    ax1.step([-r["forgetting"] for r in front], [r["target_accuracy"] for r in front], where="post", color="red",
             ls="--", lw=1, alpha=0.6, label="frontier over all methods")
    # settings that ended near chance (a diverged run) would squeeze the rest into a corner: listed instead
    xlim, ylim, off = chart_limits(rows)
    if xlim:
        ax1.set_xlim(*xlim)
        ax1.set_ylim(*ylim)
    if off:
        ax1.text(0.99, 0.01, "off the chart (accuracy < " + f"{CHART_MIN_ACCURACY:g}):\n" + "\n".join(
            f"{r['label']}: {r['target_accuracy']:.3f}, ΔAUC {r['forgetting']:+.3f}" for r in off),
            transform=ax1.transAxes, ha="right", va="bottom", fontsize=7,
            bbox=dict(boxstyle="round", fc="white", ec="grey", alpha=0.9))
    ax1.set_xlabel(f"forgetting: SNLI AUC drop from the pretrained {base['snli_auc']:.3f} (mean ± std over seeds)")
    ax1.set_ylabel("target accuracy (held-out)")
    ax1.set_title("target accuracy vs forgetting: each method's settings, its frontier joined")
    ax1.grid(alpha=0.3)
    if off:  # the lower right is empty on a chart whose worst runs are listed apart
        ax1.legend(fontsize=7, ncol=2, loc="lower right", bbox_to_anchor=(1.0, 0.1))
    else:
        ax1.legend(fontsize=7, ncol=2)
    if len(adam) > 1:
        pts = sorted(adam, key=lambda r: r.get("stopped_at") or 1e9)
        ups = [r.get("stopped_at") or updates for r in pts]
        ax2.errorbar(ups, [r["target_accuracy"] for r in pts], yerr=[r["target_accuracy_std"] for r in pts],
                     color="black", marker="o", capsize=2, label="target accuracy")
        ax2.set_xlabel("updates")
        ax2.set_ylabel("target accuracy (held-out)")
        tw = ax2.twinx()
        tw.errorbar(ups, [-r["forgetting"] for r in pts], yerr=[r["forgetting_std"] for r in pts], color="tab:red",
                    marker="s", capsize=2, label="SNLI AUC drop")
        tw.set_ylabel("SNLI AUC drop", color="tab:red")
        ax2.set_title("adam: accuracy and forgetting along its runs")
        ax2.grid(alpha=0.3)
    else:
        ax2.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    limits = ax1.get_xlim(), ax1.get_ylim()
    plt.close(fig)
    return limits


def overview_plot(summary, tasks, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12.5, 6.5))
    marks = dict(zip(tasks, "os^"))
    colors = [plt.cm.tab20(i % 20) if i < 20 else plt.cm.Dark2(i % 8) for i in range(len(summary))]
    for (m, s), color in zip(sorted(summary.items()), colors):
        pts = [(s["tasks"][t]["d_forgetting"], s["tasks"][t]["d_accuracy"], t) for t in tasks if t in s["tasks"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=0.6, alpha=0.5)
        for x, y, t in pts:
            ax.scatter(x, y, marker=marks[t], color=color, s=36, label=m if t == pts[0][2] else None, zorder=3)
    ax.axhline(0, color="k", lw=0.8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("forgetting saved against Adam (ΔAUC − Adam's ΔAUC; right = forgets less)")
    ax.set_ylabel("held-out accuracy − Adam's")
    ax.set_ylim(max(ax.get_ylim()[0], -0.15), ax.get_ylim()[1])
    handles = [plt.Line2D([], [], marker=marks[t], color="gray", ls="", label=t) for t in tasks]
    first = ax.legend(handles=handles, title="task", loc="lower left", fontsize=8)
    ax.add_artist(first)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1), title="method (its movie setting)")
    ax.set_title("Every method against Adam on every target task (points below −0.15 accuracy clipped)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
