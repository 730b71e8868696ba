"""The figures: a task's accuracy against forgetting (each method's frontier, the WiSE-FT curves, Adam along
its runs) and the summary's gaps to Adam on every task, both as small multiples: one panel per family of
methods (the catalogue's family; RecAdam + X is in X's), Adam drawn in each for reference (where the
table has Adam: a control table may not).
matplotlib is imported only here, when drawing."""

import math
import textwrap

import numpy as np

from recadam_fairseq import catalogue
from recadam_fairseq.engine.settings import METHODS, fmt, group

# the panels leave out settings below this (near chance: 0.5) when most settings are above it
CHART_MIN_ACCURACY = 0.6
# a setting is far outside the bulk beyond this many interquartile ranges of the settings' forgetting (Tukey's
# far-out fence), the range counted as at least FENCE_FLOOR: a few equal points mark nothing as far out
FENCE, FENCE_FLOOR = 3.0, 0.01
# the overview's panels stop here: a gap to Adam's accuracy below it is marked at the edge
OVERVIEW_MIN_GAP = -0.15
# one colour per method within a panel: tab10 without its red (the frontier) and grey (Adam's run)
PALETTE = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "purple", "brown", "pink", "olive", "cyan"))
ADAM = "black"
KEY_UPDATES = 6  # the key lists Adam's intermediate points' updates up to this many, a range beyond
# where a point's label may go, in points from the point, first fit first
LABEL_OFFSETS = ((4, 3), (4, -3), (-4, 3), (-4, -3), (10, 0), (-10, 0), (4, 14), (4, -14), (-4, 14), (-4, -14),
                 (4, 25), (4, -25), (-4, 25), (-4, -25))


def family(method: str) -> str:
    """The panel a method is drawn in: its family in the catalogue (RecAdam + X is in X's)."""
    return catalogue.get(method).panel


def families(names):
    """{family: [its methods among ``names``]}, in the catalogue's order; Adam, drawn in every panel,
    is in none (a figure of Adam alone gets one panel: {"adam": []})."""
    out = {}
    for n in sorted(dict.fromkeys(names), key=lambda n: catalogue.position(catalogue.get(n).name)):
        if catalogue.get(n).name != "adam":
            out.setdefault(family(n), []).append(n)
    return out or {"adam": []}


def far_out(values):
    """(lo, hi): Tukey's far-out fences of ``values``, FENCE interquartile ranges beyond the quartiles."""
    q1, q3 = np.percentile(values, [25, 75])
    iqr = max(q3 - q1, FENCE_FLOOR)
    return q1 - FENCE * iqr, q3 + FENCE * iqr


def chart_limits(rows, min_accuracy=CHART_MIN_ACCURACY):
    """The panels' (xlim, ylim) (x = forgetting, positive = forgot; y = target accuracy) and the final settings drawn
    as off-scale markers at their edge instead of at their place. Settings that ended near chance
    (accuracy below ``min_accuracy``, in the rows' units: CHART_MIN_ACCURACY of a fraction, 60 of a metric logged
    x100; None for a metric without a chance level, BLEU: a diverged run) would squeeze the rest into a corner: they
    are off the scale when the settings above the threshold outnumber them, and the limits fit the
    points above it (WiSE-FT points included; a curve that goes below is cut at the edge).
    Otherwise (a short smoke run, where most or all are near chance) every point and its error bars
    is on the chart. So is every setting's forgetting, but for those far outside the bulk (far_out:
    re-initialised layers), off the scale too. None for no rows."""
    final = [r for r in rows if not r.get("stopped_at")]
    floor = -math.inf if min_accuracy is None else min_accuracy
    low = [r for r in final if r["target_accuracy"] < floor]
    low = low if len(final) - len(low) > len(low) else []
    kept = [r for r in final if all(r is not o for o in low)]
    lo, hi = far_out([r["forgetting"] for r in kept]) if kept else (-math.inf, math.inf)
    off = low + [r for r in kept if not lo <= r["forgetting"] <= hi]
    inside = [r for r in rows if all(r is not o for o in off)]
    wise = [p for r in inside for p in r.get("interpolated", [])]
    shown = inside + wise  # the WiSE-FT curves' points too
    if low:
        shown = [r for r in shown if r["target_accuracy"] >= floor]
        xs, ys = [r["forgetting"] for r in shown], [r["target_accuracy"] for r in shown]
        x_lo, x_hi, y_lo, y_hi = min(xs), max(xs), min(ys), max(ys)
    elif shown:
        x_lo = min(r["forgetting"] - (r["forgetting_std"] or 0) for r in shown)
        x_hi = max(r["forgetting"] + (r["forgetting_std"] or 0) for r in shown)
        y_lo = min(r["target_accuracy"] - (r["target_accuracy_std"] or 0) for r in shown)
        y_hi = max(r["target_accuracy"] + (r["target_accuracy_std"] or 0) for r in shown)
    else:
        return None, None, []
    if any(r.get("interpolated") for r in final):  # the curves head for θ* at x = 0
        x_lo, x_hi = min(x_lo, 0.0), max(x_hi, 0.0)
    pad_x, pad_y = 0.05 * (x_hi - x_lo or 0.01), 0.05 * (y_hi - y_lo or 0.01)
    return (x_lo - pad_x, x_hi + 2 * pad_x), (y_lo - pad_y, y_hi + pad_y), off  # room for the labels on the right


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is missing (the GPU machine's
    image may lack it; --report-only draws the figures later)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its import logs at DEBUG when the root does
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def grid(plt, panels, width=4.6, height=3.7):
    """A figure with room for ``panels`` panels, as near square a grid as fits a page; its GridSpec."""
    cols = min(panels, 2 if panels <= 4 else 3 if panels <= 9 else 4)
    rows = math.ceil(panels / cols)
    fig = plt.figure(figsize=(width * cols, height * rows + 0.9), layout="constrained")
    return fig, fig.add_gridspec(rows, cols)


def knob_labels(rs):
    """Each setting's knobs that differ among ``rs`` (one method's settings; the legend names the
    method), or no labels for a single setting."""
    keys = [k for k in METHODS[rs[0]["method"]] if len({r[k] for r in rs}) > 1]
    return [", ".join(f"{k}={fmt(r[k])}" for k in keys) for r in rs]


def edge_point(x, y, xlim, ylim):
    """Where a point outside the limits is marked: clamped to the edge, with the marker pointing
    the way it lies (below first: a diverged run)."""
    pad_x, pad_y = 0.01 * (xlim[1] - xlim[0]), 0.01 * (ylim[1] - ylim[0])
    cx, cy = min(max(x, xlim[0] + pad_x), xlim[1] - pad_x), min(max(y, ylim[0] + pad_y), ylim[1] - pad_y)
    marker = "v" if y < ylim[0] else "^" if y > ylim[1] else ">" if x > xlim[1] else "<"
    return cx, cy, marker


def off_scale(ax, x, y, color, text, xlim, ylim, labels):
    """An off-scale marker at the edge for a point outside the limits, moved along the edge off the
    points labelled before it; its values go to ``labels``."""
    cx, cy, marker = edge_point(x, y, xlim, ylim)
    w, h = xlim[1] - xlim[0], ylim[1] - ylim[0]
    while any(abs(cx - lx) < 0.04 * w and abs(cy - ly) < 0.04 * h for lx, ly, *_ in labels):
        if marker in "<>":
            cy -= 0.05 * h
        else:
            cx -= 0.05 * w
    ax.plot([cx], [cy], marker=marker, color=color, ms=8, ls="", clip_on=False, zorder=5)
    labels.append((cx, cy, text, color))


def place_labels(ax, labels, taken=()):
    """Each (x, y, text, colour) written beside its point where it overlaps no label placed before it
    (nor the boxes ``taken``, e.g. the legend) and stays inside the panel; the first place if none."""
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    # the settings' points (drawn as "o") and the marked points stay visible
    xy = [p for line in ax.lines if line.get_marker() == "o" for p in line.get_xydata()] + [lb[:2] for lb in labels]
    points = [Bbox.from_bounds(*ax.transData.transform(p) - 4, 8, 8) for p in xy]
    placed = list(taken)
    for x, y, text, color in labels:
        a = ax.annotate(text, (x, y), xytext=LABEL_OFFSETS[0], textcoords="offset points", fontsize=8, color=color,
                        zorder=6)
        scores = []
        for i, (dx, dy) in enumerate(LABEL_OFFSETS):
            set_offset(a, dx, dy)
            box = a.get_window_extent(renderer)
            outside = not (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            scores.append((outside, sum(box.overlaps(b) for b in placed + points), i))
            if scores[-1][:2] == (False, 0):
                break
        set_offset(a, *LABEL_OFFSETS[min(scores)[2]])  # the best place, if none is free
        placed.append(a.get_window_extent(renderer))


def set_offset(a, dx, dy):
    """An annotation's text ``(dx, dy)`` points from its point, aligned to lean away from it."""
    a.set_position((dx, dy))
    a.set_ha("left" if dx >= 0 else "right")
    a.set_va("bottom" if dy > 0 else "top" if dy < 0 else "center")


def lay_out(fig, panels, labels):
    """The figure laid out, then each panel's labels placed clear of each other and of its legend."""
    fig.draw_without_rendering()
    fig.set_layout_engine("none")  # the labels are placed for this layout: kept as it is
    renderer = fig.canvas.get_renderer()
    for name, ax in panels.items():
        place_labels(ax, labels[name], [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() else [])


def update_of(r, default=1e9):
    """The update a row of Adam's curve stands at: an intermediate point's, else ``default`` (the comparison's final
    checkpoint: the end)."""
    return r.get("stopped_at") or default


def by_update(rows):
    """Adam's runs along their updates: the comparison's intermediate checkpoints, then its final row; a grid's
    validations (engine/verdicts.py's curve). Not a grid's setting row (``at_update``): the mean of its seeds' best
    validations, at updates of their own, is no point of the curve."""
    return sorted((r for r in rows if r["method"] == "adam" and "at_update" not in r), key=update_of)


def draw_curves(ax, rs, color, off, lims, labels):
    """One method's settings (mean ± std), its frontier joined, each setting's WiSE-FT curve dotted
    and its knobs written; a setting in ``off`` marked at the edge instead."""
    for r, text in zip(rs, knob_labels(rs)):
        if any(r is o for o in off):
            x, y = r["forgetting"], r["target_accuracy"]
            value = ", ".join(([f"acc {y:.3f}"] if not lims[1][0] <= y <= lims[1][1] else []) +
                              ([f"drop {x:.3f}"] if not lims[0][0] <= x <= lims[0][1] else []))
            off_scale(ax, x, y, color, (text + ": " if text else "") + value, *lims, labels)
            continue
        ax.errorbar(r["forgetting"], r["target_accuracy"], xerr=r["forgetting_std"] or 0.0,
                    yerr=r["target_accuracy_std"] or 0.0,
                    fmt="o", color=color, ms=5, capsize=2, alpha=0.9)
        if text:
            labels.append((r["forgetting"], r["target_accuracy"], text, color))
    front = sorted((r for r in rs if r["method_frontier"]), key=lambda r: r["forgetting"])
    if len(front) > 1:
        ax.plot([r["forgetting"] for r in front], [r["target_accuracy"] for r in front], color=color, lw=1)
    for r in rs:  # WiSE-FT: from the smallest α measured to the run itself (α = 1)
        pts = r.get("interpolated", []) + [r]
        if len(pts) > 1:
            ax.plot([p["forgetting"] for p in pts], [p["target_accuracy"] for p in pts], color=color, ls=":",
                    lw=1, marker="x", ms=3, alpha=0.8)


def draw_reference(ax, rows, final):
    """What every panel shows: θ*'s line (with WiSE-FT curves), Adam's run along its updates, the
    frontier over all methods."""
    if any(r.get("interpolated") for r in final):
        ax.axvline(0, color="grey", lw=0.8, ls="-.", alpha=0.6)
    adam = by_update(rows)
    if len(adam) > 1:
        ax.plot([r["forgetting"] for r in adam], [r["target_accuracy"] for r in adam], color="grey", ls=":",
                marker=".")
    front = sorted((r for r in final if r["frontier"]), key=lambda r: r["forgetting"])
    ax.step([r["forgetting"] for r in front], [r["target_accuracy"] for r in front], where="post", color="red",
            ls="--", lw=0.8, alpha=0.5)


def method_panel(ax, rows, final, names, off, lims):
    """One family's panel: Adam for reference, then each of its methods' curves in its own colour;
    returns the labels to place once the figure is laid out."""
    draw_reference(ax, rows, final)
    labels = []
    groups = dict.fromkeys(group(r) for r in final if r["method"] in names)
    for color, g in zip((ADAM,) + PALETTE, ["adam"] + [g for g in groups if g != "adam"]):
        rs = [r for r in final if group(r) == g]
        if rs:
            draw_curves(ax, rs, color, off, lims, labels)
            ax.plot([], [], marker="o", color=color, ls="-" if len(rs) > 1 else "", lw=1, label=g)
    ax.set_xlim(*lims[0])
    ax.set_ylim(*lims[1])
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run of other methods' checkpoints alone has none
        ax.legend(fontsize=8, loc="best")
    return labels


def adam_panel(ax, rows, updates, text):
    """Adam's accuracy and forgetting along its runs (its intermediate checkpoints), two y axes."""
    pts = by_update(rows)
    ups = [update_of(r, updates) for r in pts]
    ax.errorbar(ups, [r["target_accuracy"] for r in pts], yerr=[r["target_accuracy_std"] or 0.0 for r in pts],
                color="black", marker="o", capsize=2)
    ax.set_xlabel("updates")
    ax.set_ylabel(text["y"])
    tw = ax.twinx()
    tw.errorbar(ups, [r["forgetting"] for r in pts], yerr=[r["forgetting_std"] or 0.0 for r in pts], color="tab:red",
                marker="s", capsize=2)
    tw.set_ylabel(text["drop"], color="tab:red")
    ax.set_title("adam: accuracy (black) and forgetting (red) along its runs", fontsize=9)
    ax.grid(alpha=0.3)


def key_panel(ax, plt, rows, final, off):
    """The legend of what the panels show, each entry only when something of it is drawn: the frontier over all
    methods (two settings or more on it), a method's frontier joined (one with two or more), the marks at the
    edge (``off``: settings off the scale)."""
    ax.axis("off")
    adam = by_update(rows)
    point = any(r["method"] == "adam" for r in final)
    handles = [plt.Line2D([], [], color=ADAM if point else "grey", marker="o",
                          label=("adam (each point: mean ± std over seeds)" if point
                                 else "each point: mean ± std over seeds"))]
    if len(adam) > 1:
        ups = [r["stopped_at"] for r in adam if r.get("stopped_at")]  # a grid's: every validation, a range then
        handles.append(plt.Line2D([], [], color="grey", ls=":", marker=".", label="adam, the same runs after " + (
            ", ".join(map(str, ups)) if len(ups) <= KEY_UPDATES else f"{ups[0]} to {ups[-1]} ({len(ups)} points)")
            + " updates"))
    wise = sorted({p["alpha"] for r in final for p in r.get("interpolated", [])})
    if wise:  # θ* (α = 0) forgets nothing but has no head of its own for the target: its line, no point
        handles += [plt.Line2D([], [], color="black", ls=":", marker="x", ms=3, label="WiSE-FT (1 − α)·θ* + α·θ, "
                               "α = " + ", ".join(map(fmt, wise)) + ", 1"),
                    plt.Line2D([], [], color="grey", lw=0.8, ls="-.", label="θ* (α = 0): no forgetting")]
    if sum(bool(r["frontier"]) for r in final) > 1:  # draw_reference's step: a line from two points on
        handles.append(plt.Line2D([], [], color="red", ls="--", lw=0.8, label="frontier over all methods"))
    joined = any(sum(bool(r["method_frontier"]) for r in final if group(r) == g) > 1 for g in {group(r) for r in final})
    if any(r["method"] != "adam" for r in final):
        handles.append(plt.Line2D([], [], color=PALETTE[0], lw=1 if joined else 0, marker="o",  # (black: Adam's)
                                  label="a method's settings" + (", its frontier joined" if joined else "")))
    if off:
        handles.append(plt.Line2D([], [], color="grey", marker=">", ls="", ms=8,
                                  label="off the scale (near chance, or far out):\nat the edge, its value written"))
    ax.legend(handles=handles, loc="center", fontsize=8, frameon=False)


def comparison_text(base):
    """The comparison's texts of a task's figure: the axes (x: the forgetting, y: the target's metric), Adam's
    forgetting axis (``drop``) and the title (a grid's summary passes its own: engine/verdicts.py)."""
    return {"x": f"forgetting: SNLI AUC drop from the pretrained {base['snli_auc']:.3f} (mean ± std over seeds)",
            "y": "target accuracy (held-out)", "drop": "SNLI AUC drop",
            "title": "target accuracy vs forgetting, one panel per family of methods (its page in docs/)"}


def figure(rows, base, updates, text=None):
    """The task's figure: one panel per family present (Adam in each, if any), Adam along its runs, the key.
    ``text``: the axes' and title's (comparison_text(base) by default), and ``min_accuracy`` (chart_limits's, in the
    rows' units: a grid's summary passes its own, engine/verdicts.py). Returns the figure, {family: its panel}
    and the panels' (xlim, ylim); None without matplotlib."""
    text = text or comparison_text(base)
    plt = pyplot()
    if plt is None:
        return None
    final = [r for r in rows if not r.get("stopped_at")]
    adam = by_update(rows)
    fams = families(r["method"] for r in final)
    xlim, ylim, off = chart_limits(rows, text.get("min_accuracy", CHART_MIN_ACCURACY))
    fig, gs = grid(plt, len(fams) + 1 + (len(adam) > 1))
    panels, labels, first = {}, {}, None
    for i, (name, names) in enumerate(fams.items()):
        ax = panels[name] = fig.add_subplot(gs[i], sharex=first, sharey=first)
        first = first or ax
        ax.set_title(name if name == "adam" else f"{name} family", fontsize=10)
        labels[name] = method_panel(ax, rows, final, names, off, (xlim or ax.get_xlim(), ylim or ax.get_ylim()))
    if len(adam) > 1:
        adam_panel(fig.add_subplot(gs[len(fams)]), rows, updates, text)
    key_panel(fig.add_subplot(gs[len(fams) + (len(adam) > 1)]), plt, rows, final, off)
    cols = gs.get_geometry()[1]
    for i, ax in enumerate(panels.values()):  # the forgetting axis under the panels it is of: each column's lowest
        if i + cols >= len(fams):
            ax.set_xlabel(textwrap.fill(text["x"], 56), fontsize=9)
    fig.supylabel(text["y"])
    fig.suptitle(text["title"] + (", Adam in each" if any(r["method"] == "adam" for r in final) else ""))
    lay_out(fig, panels, labels)
    return fig, panels, (first.get_xlim(), first.get_ylim())


def plot(rows, base, out, updates, text=None):
    """The figure at ``out``; returns the panels' (xlim, ylim) (None without matplotlib)."""
    drawn = figure(rows, base, updates, text)
    if drawn is None:
        return None
    fig, _, limits = drawn
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
    return limits


def overview_panel(ax, summary, names, tasks, marks, labels):
    """One family's gaps to Adam on every task: a method's tasks joined, one colour per method; a gap
    below OVERVIEW_MIN_GAP marked at the bottom edge."""
    for color, m in zip(PALETTE, names):
        pts = [(-summary[m]["tasks"][t]["d_forgetting"], summary[m]["tasks"][t]["d_accuracy"], t)  # x: forgets less
               for t in tasks if t in summary[m]["tasks"]]
        ax.plot([p[0] for p in pts], [max(p[1], OVERVIEW_MIN_GAP) for p in pts], color=color, lw=0.8, alpha=0.6,
                label=m)
        for x, y, t in pts:
            if y < OVERVIEW_MIN_GAP:
                off_scale(ax, x, y, color, f"{t}: {y:+.3f}", ax.get_xlim(), (OVERVIEW_MIN_GAP, ax.get_ylim()[1]),
                          labels)
            else:
                ax.scatter(x, y, marker=marks[t], color=color, s=36, zorder=3)
    ax.axhline(0, color=ADAM, lw=0.8)
    ax.axvline(0, color=ADAM, lw=0.8)
    ax.grid(alpha=0.3)


def overview_figure(summary, tasks):
    """The summary's figure: one panel per family, each method's gap to Adam (Adam: the cross at 0, 0)
    on every task. Returns the figure and {family: its panel}."""
    plt = pyplot()
    marks = dict(zip(tasks, "os^D"))
    fams = families(summary)
    fig, gs = grid(plt, len(fams) + 1, width=4.2, height=3.4)
    xs = [-t["d_forgetting"] for s in summary.values() for t in s["tasks"].values()]  # (drawn as forgets less)
    ys = [t["d_accuracy"] for s in summary.values() for t in s["tasks"].values()]
    pad = 0.05 * (max(xs) - min(xs) or 0.01)
    ylim = (OVERVIEW_MIN_GAP - 0.01, max(ys) + 0.01) if min(ys) < OVERVIEW_MIN_GAP else (min(ys) - 0.01, max(ys) + 0.01)
    panels, labels, first = {}, {}, None
    for i, (name, names) in enumerate(fams.items()):
        ax = panels[name] = fig.add_subplot(gs[i], sharex=first, sharey=first)
        first = first or ax
        ax.set_xlim(min(xs) - pad, max(xs) + pad)
        ax.set_ylim(*ylim)
        ax.set_title(f"{name} family", fontsize=10)
        labels[name] = []
        overview_panel(ax, summary, names, tasks, marks, labels[name])
        ax.legend(fontsize=8, loc="lower left")
    key = fig.add_subplot(gs[len(fams)])
    key.axis("off")
    key.legend(handles=[plt.Line2D([], [], marker=marks[t], color="gray", ls="", label=t) for t in tasks] + [
        plt.Line2D([], [], color=ADAM, lw=0.8, label="adam: the cross at (0, 0)"),
        plt.Line2D([], [], color="gray", marker="v", ls="", ms=8, label=f"accuracy gap below {OVERVIEW_MIN_GAP:g}:"
                   "\nat the edge, its value written")], title="task (each method at its movie setting)",
        loc="center", fontsize=8, frameon=False)
    fig.supxlabel("forgetting saved against Adam (ΔAUC − Adam's ΔAUC; right = forgets less)")
    fig.supylabel("held-out accuracy − Adam's")
    fig.suptitle("Every method against Adam on every target task, one panel per family of methods")
    lay_out(fig, panels, labels)
    return fig, panels


def overview_plot(summary, tasks, out):
    fig, _ = overview_figure(summary, tasks)
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
