"""Summarize GLUE fine-tuning runs made by scripts/glue/finetune.sh and grid.sh.

    python scripts/glue/summarize.py RUNS_DIR [--out DIR] [--include-unfinished] [--forgetting-budget X]

Finds the runs under RUNS_DIR (laid out as RUNS_DIR/<TASK>/<METHOD>[-k<K>-t<T0>...]/seed<N>/),
reads their fairseq ``--log-format json`` logs (train.log) and writes to --out (default RUNS_DIR):

  summary.md    the task x method table, the GLUE average, the best (k, t0) per task, the grid
                of means per (k, t0), and the unfinished runs
  summary.csv   the task x method table: mean, std, number of seeds and chosen config per method
  variants.csv  every (task, method, config): mean, std, seeds, and whether it was chosen
  runs.csv      one line per run: status, best dev metric, the update it came at, other metrics

Per run, the score is the task's dev metric (CoLA: mcc; MRPC, QQP: f1; STS-B: pearson; the
others: accuracy), the best (max) over the run's validations on ``valid``. For MNLI ``valid`` is
matched; the mismatched accuracy (``valid1``) is shown as the row MNLI-mm, taken from the same
runs as MNLI and left out of the average. A method's result on a task is the mean +- sample std
over seeds of the config (k, t0, ...) whose mean is highest; the GLUE average is the mean of
those over the tasks the method has. Runs without a ``done`` marker are listed as unfinished and
left out of the tables unless --include-unfinished.

Runs with the forgetting meter (FORGETTING_PROBE=..., docs/forgetting-meter.md) show, per run, the forgetting
at the chosen validation: the masked-LM loss's rise since θ* (bits) or the pair AUC's fall. With
--forgetting-budget X, a run's best validation is the best among those that forgot at most X (a run without
the meter: among all, noted); without it, a run trained with a budget (FORGETTING_BUDGET, --forgetting-budget)
is read with its own. Of equal scores the later validation is taken, as fairseq's checkpoint_best.pt takes it.
Each run names the file that holds the chosen validation's weights: checkpoint_best.pt when it is the one
fairseq kept there (a run trained with the same budget, or none with none), else a numbered, epoch or last
checkpoint saved at that update and still there, else none.
Translation runs (scripts/seq2seq/finetune.sh, laid out as RUNS_DIR/<DATA>/<METHOD>/seed<N>/, scored by the
metric run.json names: bleu) forget in BLEU: its fall since θ* on the subsets after ``valid`` (the original
domain's), from the ``bleu_delta`` that --eval-bleu-start logs; --forgetting-budget applies to it as above.

Runs with a probe also answer which method keeps the metric and forgets least (docs/forgetting-your-task.md):
per task, forgetting-<TASK>.png (each setting's metric against its forgetting, mean ± std over seeds, each
method's frontier, Adam's curve along its validations) and verdicts.csv and summary.md's "Which method forgets
least": against Adam by the comparison's rule (docs/forgetting.md), keeps Adam's metric within the seed noise,
forgets less beyond it, on the frontier. Runs without a probe: none of these. With --wise-ft ALPHA..., Adam's runs
with a probe also get WiSE-FT points: their weights at the chosen validation mixed with θ* at each α, scored by
fairseq's validation and the run's meter (tools/wise_points.py; kept in the run's wise-ft.json), drawn as Adam's
dotted curve and judged against Adam in the same section.

Multi-task runs (scripts/glue/multitask.sh, laid out as RUNS_DIR/MTL/<NAME>/seed<N>/) give one
row per task they trained, all read at the validation with the best ``glue_avg`` (one model
for every task); <NAME> is their method column.
"""

import argparse
import os
import subprocess
import sys

from recadam_fairseq.engine import verdicts
from recadam_fairseq.engine.aggregate import order, summarize
from recadam_fairseq.engine.read import find_runs, read_runs, wise_points
from recadam_fairseq.engine.write import run_line, write_summary


def with_wise_ft(runs, root, alphas):
    """``runs`` with WiSE-FT points at ``alphas`` for Adam's finished runs with a probe (tools/wise_points.py, in its
    own process: torch and fairseq stay out of the summary)."""
    out = []
    for r in runs:
        if (r["method"] == "adam" and r["status"] == "done" and r["forgetting"] is not None
                and r["checkpoint"].endswith(".pt")):  # else "none (no checkpoint of update N kept)"
            run_dir = os.path.join(root, r["path"])
            if not set(alphas) <= {p["alpha"] for p in r["wise"]}:
                print(f"summarize.py: WiSE-FT of {r['path']} ({r['checkpoint']}) at α {' '.join(map(str, alphas))}",
                      flush=True)
                proc = subprocess.run([sys.executable, "-m", "recadam_fairseq.tools.wise_points", run_dir,
                                       os.path.join(run_dir, r["checkpoint"]), "--alphas", *map(str, alphas)],
                                      stderr=subprocess.PIPE, text=True)
                if proc.returncode:  # its one line (or a traceback's last): this run gets no points, the rest do
                    why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                    print(f"summarize.py: --wise-ft: {r['path']} not scored: "
                          f"{why.removeprefix('wise_points: error: ')}", file=sys.stderr, flush=True)
                else:
                    r = dict(r, wise=wise_points(run_dir, r["checkpoint"], r["metric"]))
        out.append(r)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if (argv if argv is not None else sys.argv[1:])[:1] == ["--run"]:  # one run's line (the task scripts' end)
        ap.add_argument("--run", required=True, metavar="RUN_DIR")
        ap.add_argument("--metric", help="the metric (default: the task's, from the run's path)")
        a = ap.parse_args(argv)
        print(run_line(a.run, a.metric))
        return
    ap.add_argument("runs_dir")
    ap.add_argument("--out", help="where to write the summary files (default: RUNS_DIR)")
    ap.add_argument("--include-unfinished", action="store_true",
                    help="count runs without a done marker (their best so far) in the tables")
    ap.add_argument("--forgetting-budget", type=float, metavar="X",
                    help="runs with the forgetting meter: the best validation among those that forgot at most X "
                         "(the masked-LM loss's rise in bits, or the pair AUC's fall, since θ*); translation runs "
                         "with bleu_delta (--eval-bleu-start): BLEU's largest fall since θ* on the other subsets")
    ap.add_argument("--wise-ft", type=float, nargs="+", metavar="ALPHA",
                    help="also WiSE-FT of Adam's runs with a probe at each α: their weights at the chosen validation "
                         "mixed with θ*, scored by fairseq's validation and the run's meter (each point once, kept "
                         "in the run's wise-ft.json); drawn on Adam's point and judged by the same rule")
    args = ap.parse_args(argv)
    root = args.runs_dir
    if not os.path.isdir(root):
        sys.exit(f"summarize.py: error: {root}: no such directory")
    runs = [r for d in find_runs(root) for r in read_runs(d, root, args.forgetting_budget)]
    if args.wise_ft:
        runs = with_wise_ft(runs, root, args.wise_ft)
    if not runs:
        sys.exit(f"summarize.py: error: no runs under {root} (expected <TASK>/<METHOD>/seed<N>/train.log)")
    runs.sort(key=lambda r: (order(r["task"]), r["method"], r["config"], str(r["seed"])))
    counted = [r for r in runs if r["status"] == "done" or args.include_unfinished]
    write_summary(args.out or root, root, runs, summarize(counted), args.include_unfinished, args.forgetting_budget,
                  verdicts.answer(counted, root))


if __name__ == "__main__":
    main()
