"""Plot fairseq json logs of recadam (and plain adam) runs: λ(t), Σ(θ−θ*)², target loss, dev metric,
and the forgetting meter's change since θ* where a run has it (--forgetting-probe).

    python scripts/plot_run.py RUN1/train.log RUN2/train.log --labels recadam adam --out runs.png [--table]

--table also prints, as a Markdown table, each run's best dev metric and its update by summarize.py's rule (the
later of equal validations, as fairseq's checkpoint_best.pt), with the forgetting there and at its last validation.

A log is what `fairseq-train --log-format json` prints (or writes with --log-file). One line per
run in each panel, against updates; runs without recadam metrics (e.g. --optimizer adam) simply
have no λ / distance line.
"""

import argparse
import os

import numpy as np

from recadam_fairseq.core.forgetting import label as forgetting_label
from recadam_fairseq.engine.aggregate import best_of, run_forgetting
from recadam_fairseq.engine.fairseq_log import parse_log, read_log

DEV_METRICS = ("accuracy", "mcc", "f1", "pearson", "spearman", "acc_and_f1")


def series(records, key, x_key="num_updates"):
    xs, ys = [], []
    for r in records:
        if key in r and x_key in r:
            try:
                xs.append(float(r[x_key]))
                ys.append(float(r[key]))
            except (TypeError, ValueError):
                continue
    return xs, ys


def pick_metric(logs):
    for m in DEV_METRICS:
        if any(f"valid_{m}" in r for log in logs for r in log.get("valid", [])):
            return m
    return "loss"


FORGETTING = [  # (the meter's valid key, the panel's title), the first a run has is drawn
    ("fgt_mlm_loss_delta", "forgetting: masked-LM loss − at θ*\n(bits on held-out text; up: forgot)"),
    ("fgt_pairs_auc_delta", "forgetting: pair AUC − at θ*\n(zero-shot probe; down: forgot)"),
]


def run_labels(paths, labels=None):
    """The given labels, or each log's directory name."""
    return labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]


def plot(paths, labels=None, out="run.png", metric=None):
    """Write the PNG and return the matplotlib figure (four panels, one line per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [read_log(p) for p in paths]
    labels = run_labels(paths, labels)
    if len(labels) != len(paths):
        raise SystemExit(f"--labels: {len(labels)} labels for {len(paths)} logs")
    metric = metric or pick_metric(logs)
    # the forgetting meter's change since θ* (--forgetting-probe), when a run logged it: a third column
    meter = next(((k, t) for k, t in FORGETTING if any(f"valid_{k}" in r for log in logs for r in log.get("valid", []))),
                 None)
    cols = 3 if meter else 2
    fig, axes = plt.subplots(2, cols, figsize=(5.5 * cols, 7.5), sharex=True)
    panels = [
        (axes[0][0], "train_inner", "recadam_lambda", "λ(t)", "linear"),
        (axes[0][1], "train_inner", "recadam_dist", "Σ(θ−θ*)²  (distance to the pretrained weights)", "log"),
        (axes[1][0], "train_inner", "target_loss", "train target loss (bits)", "linear"),
        (axes[1][1], "valid", f"valid_{metric}", f"dev {metric}", "linear"),
    ]
    if meter:
        panels.append((axes[0][2], "valid", f"valid_{meter[0]}", meter[1], "linear"))
        axes[1][2].set_visible(False)
    for ax, kind, key, title, scale in panels:
        for log, label in zip(logs, labels):
            x_key = "valid_num_updates" if kind == "valid" else "num_updates"
            xs, ys = series(log.get(kind, []), key, x_key)
            if not xs and key == "target_loss":  # plain sentence_prediction logs only "loss"
                xs, ys = series(log.get(kind, []), "loss", x_key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label)
        ax.set_title(title)
        if scale == "log" and any(line.get_ydata().min() > 0 for line in ax.get_lines()):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("updates")
    if meter:
        axes[0][2].tick_params(labelbottom=True)  # its partner below may be hidden
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return fig


def _signed(x) -> str:
    """Two significant digits, signed, without an exponent (the table's −0.00001, not −1e−05)."""
    if x is None:
        return ""
    return np.format_float_positional(x, precision=2, unique=False, fractional=False, trim="-", sign=True).replace("-", "−")


def table(paths, labels, metric):
    """The Markdown lines of each run's best dev ``metric`` (update) by summarize.py's rule (engine/aggregate.best_of),
    and its forgetting (positive = forgot) at that validation and at its last one."""
    rows, meter = [], None
    for path, name in zip(paths, labels):
        entries = parse_log(path)[0].get("valid", [])
        best, at = best_of(entries, metric)
        there, end = (run_forgetting(e) if e else None for e in (at, entries[-1] if entries else None))
        meter = meter or next((f[0] for f in (there, end) if f), None)
        rows.append(f"| {name} | " + ("none" if best is None else f"{best:.1f} ({at.get('num_updates', '?')})")
                    + f" | {_signed(there and there[1])} / {_signed(end and end[1])} |")
    fgt = f"forgetting, {forgetting_label(meter)} since θ*" if meter else "forgetting (no meter)"
    return [f"| run | dev {metric}: best (update) | {fgt}: at the best / at the last validation |",
            "|---|---|---|", *rows]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="fairseq json logs (--log-format json)")
    ap.add_argument("--labels", nargs="+", help="one label per log (default: the log's directory name)")
    ap.add_argument("--metric", help=f"dev metric to plot (default: the first found of {', '.join(DEV_METRICS)})")
    ap.add_argument("--out", default="run.png", help="PNG to write")
    ap.add_argument("--table", action="store_true", help="also print each run's best dev metric (update), by "
                    "summarize.py's rule, and its forgetting there and at the end, as a Markdown table")
    args = ap.parse_args(argv)
    plot(args.logs, args.labels, args.out, args.metric)
    print(args.out)
    if args.table:
        metric = args.metric or pick_metric([read_log(p) for p in args.logs])
        print("\n".join(table(args.logs, run_labels(args.logs, args.labels), metric)))


if __name__ == "__main__":
    main()
