#!/usr/bin/env python3
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

Multi-task runs (scripts/glue/multitask.sh, laid out as RUNS_DIR/MTL/<NAME>/seed<N>/) give one
row per task they trained, all read at the validation with the best ``glue_avg`` (one model
for every task); <NAME> is their method column.
"""

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from recadam_fairseq import catalogue  # noqa: E402  (pure Python: the methods)
from recadam_fairseq.core import glue_tasks  # noqa: E402  (pure Python: the GLUE task table)
from recadam_fairseq.core.forgetting import BUDGET, forgetting, label, within_budget  # noqa: E402  (the meter's names)
from recadam_fairseq.core.glue_tasks import head_name  # noqa: E402

TASKS = glue_tasks.RECIPE_TASKS
OTHER = {n: list(t.other_metrics) for n, t in glue_tasks.TASKS.items()}
METHODS = catalogue.names()  # the run directories' methods, in the catalogue's order
MM = "MNLI-mm"
MTL = "MTL"  # directory of multi-task runs (scripts/glue/multitask.sh): MTL/<NAME>/seed<N>


def primary_metric(task):
    return glue_tasks.TASKS[task].primary_metric if task in glue_tasks.TASKS else "accuracy"


def to_float(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def parse_log(path):
    """fairseq json log -> ({subset: [stats of one validation, ...]}, last update number seen).

    Lines are either bare json (--log-file) or prefixed ("... | INFO | valid | {...}"). A
    validation line holds "<subset>_num_updates"; train lines hold "num_updates" (train_inner)
    or "train_num_updates" (end of epoch).
    """
    valid, last = defaultdict(list), None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            i = line.find('{"')
            if i < 0:
                continue
            try:
                rec = json.loads(line[i:])
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            for key in rec:
                if key == "num_updates" or key.endswith("_num_updates"):
                    n = to_float(rec[key])
                    if n is not None:
                        last = int(n) if last is None else max(last, int(n))
                if not key.endswith("_num_updates"):
                    continue
                subset = key[: -len("_num_updates")]
                if subset == "train":
                    continue
                valid[subset].append({k[len(subset) + 1:]: v for k, v in rec.items() if k.startswith(subset + "_")})
    for e in valid.get("valid", []):  # the other subsets at the same update (translation's original domain)
        e[OTHERS] = {}
        for subset, es in valid.items():
            same = [x for x in es if x.get("num_updates") == e.get("num_updates")]
            if subset != "valid" and same:
                e[OTHERS][subset] = same[-1]
    return valid, last


OTHERS = "_others"  # a valid entry's key for {subset: entry} of the other subsets validated at its update
SAVED = re.compile(r"Saved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates")


def saved_checkpoints(path):
    """{update: the file fairseq named when it saved there} from its "Saved checkpoint" lines (the first of the
    files written at that update: epoch, numbered, best, last, in fairseq's order)."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = SAVED.search(line)
            if m:
                out[int(m.group(3))] = os.path.basename(m.group(1))
    return out


def run_budget(entries):
    """The --forgetting-budget the run was trained with (the meter logs it at each validation), or None."""
    return next((b for b in (to_float(e.get(BUDGET)) for e in reversed(entries)) if b is not None), None)


def best_checkpoint_update(entries, saves):
    """The update of the validation fairseq's checkpoint_best.pt holds: the last one saved whose score under the
    run's --best-checkpoint-metric (the one with a logged best_<metric>) equals that best (fairseq rewrites
    checkpoint_best.pt on a tie); None when the log cannot say."""
    tracked = next((k[len("best_"):] for e in entries for k in e if k.startswith("best_")), None)
    found = None
    for e in entries:
        x, best, n = to_float(e.get(tracked)), to_float(e.get(f"best_{tracked}")), to_float(e.get("num_updates"))
        if tracked and x is not None and n is not None and int(n) in saves and (best is None or x == best):
            found = int(n)
    return found


def checkpoint_at(run_dir, entries, at, saves):
    """The file of ``run_dir`` that holds validation ``at``'s weights, or a note saying there is none."""
    n = to_float(at.get("num_updates"))
    if n is None:
        return ""
    n, epoch = int(n), at.get("epoch")
    have = set(os.listdir(run_dir)) if os.path.isdir(run_dir) else set()
    if best_checkpoint_update(entries, saves) == n and "checkpoint_best.pt" in have:
        return "checkpoint_best.pt"
    # a numbered or epoch file holds its update for good; checkpoint_best.pt and checkpoint_last.pt are rewritten
    names = [f"checkpoint_{epoch}_{n}.pt"]
    if saves.get(n) not in (None, "checkpoint_best.pt", "checkpoint_last.pt"):
        names.append(saves[n])
    if saves and n == max(saves):
        names.append("checkpoint_last.pt")
    found = next((name for name in names if name in have), None)
    return found or f"none (no checkpoint of update {n} kept)"


def run_forgetting(entry):
    """The forgetting meter's forgetting at a validation, or (translation, --eval-bleu-start) the largest BLEU fall
    since θ* on the other subsets: (its key, value) or None."""
    return forgetting(entry, others=entry.get(OTHERS))


def best_of(entries, metric, budget=None):
    """(best value, its stats) over validations, the later of equal ones (as fairseq's checkpoint_best.pt);
    (None, None) if the metric was never logged. With a forgetting ``budget``: over the validations whose
    forgetting is at most it (all, without the meter)."""
    best, at = None, None
    for e in entries:
        f = run_forgetting(e) if budget is not None else None
        if f is not None and not within_budget(f[1], budget):
            continue
        x = to_float(e.get(metric))
        if x is not None and (best is None or x >= best):
            best, at = x, e
    return best, at


def only_k_t0(method, config):
    """The run name of ``method`` with ``config`` sets RecAdam's k and t0 and nothing else."""
    return set(catalogue.parse_run_name(f"{method}-{config}")[1]) == {"k", "t0"}


def read_run(run_dir, root, budget=None):
    rel = os.path.relpath(run_dir, root)
    parts = rel.split(os.sep)
    meta = {}
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        pass
    # The layout <TASK>/<NAME>/seed<N> names the run; run.json (written by finetune.sh) fills in
    # what the path cannot say (k and t0 exactly, the planned number of updates).
    laid_out = len(parts) >= 3 and re.fullmatch(r"seed\d+", parts[-1])
    if laid_out:
        task, name, seed = parts[-3], parts[-2], int(parts[-1][4:])
    else:
        task, seed = meta.get("task", "?"), meta.get("seed", parts[-1])
        name = parts[-2] if len(parts) >= 2 else meta.get("method", "?")
    method, named = catalogue.parse_run_name(name)
    variant = name[len(method) + 1:]
    k, t0 = meta.get("k"), meta.get("t0")
    if k is None:
        k, t0 = named.get("k"), named.get("t0")
    # a GLUE task's metric; another (translation's data directory): what run.json names (seq2seq: bleu)
    metric = primary_metric(task) if task in glue_tasks.TASKS or "metric" not in meta else meta["metric"]
    run = {
        "task": task, "method": method, "config": variant, "k": k or "", "t0": t0 or "",
        "seed": seed, "status": "done" if os.path.exists(os.path.join(run_dir, "done")) else "unfinished",
        "metric": metric, "best": None, "best_update": "", "other": "", "mm": None,
        "last_update": "", "total_updates": meta.get("total_updates", ""), "validations": 0, "note": "",
        "path": rel, "forgetting": None, "forgetting_metric": "", "budget": budget, "checkpoint": "",
    }
    log = os.path.join(run_dir, "train.log")
    if not os.path.exists(log):
        run["status"] = "done" if run["status"] == "done" else "not started"
        run["note"] = "no train.log"
        return run
    valid, last = parse_log(log)
    entries = valid.get("valid", [])
    run["validations"] = len(entries)
    run["last_update"] = "" if last is None else last
    if budget is None:  # a run trained with a budget is read with it: its checkpoint_best.pt is that one
        budget = run["budget"] = run_budget(entries)
    best, at = best_of(entries, metric, budget)
    if best is None:
        run["note"] = f"no {metric} in the validations" if entries else "no validation yet"
        if budget is not None and best_of(entries, metric)[0] is not None:
            run["note"] = f"every validation forgot more than --forgetting-budget {budget:g}"
    else:
        run["best"] = best
        run["best_update"] = at.get("num_updates", "")
        run["checkpoint"] = checkpoint_at(run_dir, entries, at, saved_checkpoints(log))
        fgt = run_forgetting(at)
        if fgt is not None:
            run["forgetting_metric"], run["forgetting"] = label(fgt[0]), fgt[1]
        elif budget is not None:
            run["note"] = "no forgetting meter in its log: --forgetting-budget does not apply"
        run["other"] = "; ".join(f"{m}={at[m]}" for m in OTHER.get(task, []) if m in at)
    if task == "MNLI" and valid.get("valid1"):
        run["mm"], _ = best_of(valid["valid1"], "accuracy")
    return run


def read_multitask_run(run_dir, root):
    """A --task glue_multitask run (laid out as MTL/<NAME>/seed<N>): one row per task it trained.

    All tasks are scored at one validation, the one with the best ``glue_avg`` (the checkpoint
    --best-checkpoint-metric glue_avg keeps: one model for every task, as submitted; within the run's own
    forgetting budget when it was trained with one). A user's own
    tasks (``--mt-tasks NAME``, not GLUE) get no row: the run's note names them.
    """
    base = read_run(run_dir, root)
    log = os.path.join(run_dir, "train.log")
    if not os.path.exists(log):
        return [base]
    valid, _ = parse_log(log)
    best, at = best_of(valid.get("valid", []), "glue_avg", base["budget"])
    if best is None:
        base["note"] = "no glue_avg in the validations" if valid.get("valid") else "no validation yet"
        return [base]
    upd = at.get("num_updates", "")
    base["checkpoint"] = checkpoint_at(run_dir, valid["valid"], at, saved_checkpoints(log))
    glue_heads = {head_name(t) for t in glue_tasks.TASKS}
    own = sorted(k[: -len("_loss")] for k in at if k.endswith("_loss") and not k.startswith("best_")
                 and k[: -len("_loss")] not in glue_heads | {"", "target"})
    if own:  # a user's own tasks (--mt-tasks NAME): not GLUE, no row; they are in glue_avg
        base["note"] = f"not GLUE, left out: {', '.join(own)} (in glue_avg)"
        print(f"summarize.py: {base['path']}: left out {', '.join(own)}: not GLUE tasks (their metrics are in "
              f"glue_avg, which picks the validation)", file=sys.stderr)
    out = []
    for task in TASKS:
        metric = primary_metric(task)
        x = to_float(at.get(f"{head_name(task)}_{metric}"))
        if x is None:
            continue
        r = dict(base, task=task, metric=metric, best=x, best_update=upd,
                 other="; ".join(f"{m}={at[head_name(task) + '_' + m]}" for m in OTHER.get(task, [])
                                 if head_name(task) + "_" + m in at) + f"; glue_avg={best}")
        if task == "MNLI":
            mm = [e for e in valid.get("valid1", []) if e.get("num_updates") == upd]
            r["mm"] = to_float(mm[-1].get("mnli_accuracy")) if mm else None
        out.append(r)
    return out or [base]


def read_runs(run_dir, root, budget=None):
    parts = os.path.relpath(run_dir, root).split(os.sep)
    if len(parts) >= 3 and parts[-3] == MTL and re.fullmatch(r"seed\d+", parts[-1]):
        return read_multitask_run(run_dir, root)
    return [read_run(run_dir, root, budget)]


def find_runs(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        if {"train.log", "command.sh", "done"} & set(files):
            out.append(d)
            dirs[:] = []  # checkpoints etc. below a run are not runs
    return out


def mean_std(xs):
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) if len(xs) > 1 else None)


def aggregate(runs):
    """{(task, method): {config: [runs]}} over runs with a score."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if r["best"] is not None:
            groups[(r["task"], r["method"])][r["config"]].append(r)
    return groups


def summarize(runs):
    """-> (cells {(row, method): cell}, variant rows, methods, table rows, tasks)."""
    groups = aggregate(runs)
    cells, variants = {}, []
    for (task, method), by_config in groups.items():
        stats = {}
        for config, rs in by_config.items():
            m, s = mean_std([r["best"] for r in rs])
            stats[config] = (m, s, rs)
        chosen = max(sorted(stats), key=lambda c: stats[c][0])  # ties: the first config by name
        for config in sorted(stats):
            m, s, rs = stats[config]
            variants.append({"task": task, "method": method, "config": config, "k": rs[0]["k"], "t0": rs[0]["t0"],
                             "metric": rs[0]["metric"], "mean": m, "std": s, "n": len(rs),
                             "seeds": " ".join(str(r["seed"]) for r in sorted(rs, key=lambda r: str(r["seed"]))),
                             "chosen": config == chosen})
        m, s, rs = stats[chosen]
        cells[(task, method)] = {"mean": m, "std": s, "n": len(rs), "config": chosen, "k": rs[0]["k"],
                                 "t0": rs[0]["t0"], "metric": rs[0]["metric"]}
        mms = [r["mm"] for r in rs if r["mm"] is not None]
        if task == "MNLI" and mms:
            m2, s2 = mean_std(mms)
            cells[(MM, method)] = {"mean": m2, "std": s2, "n": len(mms), "config": chosen, "k": rs[0]["k"],
                                   "t0": rs[0]["t0"], "metric": "accuracy"}
    methods = [m for m in METHODS if any(k[1] == m for k in cells)]
    methods += sorted({k[1] for k in cells} - set(methods))
    tasks = [t for t in TASKS if any(k[0] == t for k in cells)]
    tasks += sorted({k[0] for k in cells} - set(TASKS) - {MM})
    rows = []
    for t in tasks:
        rows.append(t)
        if t == "MNLI" and any((MM, m) in cells for m in methods):
            rows.append(MM)
    for m in methods:  # GLUE's average: of GLUE tasks only (a translation run's BLEU is not averaged in)
        scores = [cells[(t, m)]["mean"] for t in tasks if (t, m) in cells and t in glue_tasks.TASKS]
        if scores:
            cells[("GLUE avg", m)] = {"mean": statistics.fmean(scores), "std": None, "n": len(scores),
                                      "config": f"{len(scores)} tasks", "k": "", "t0": "", "metric": ""}
    return cells, sorted(variants, key=lambda v: (order(v["task"]), v["method"], v["config"])), methods, rows, tasks


def order(task):
    return TASKS.index(task) if task in TASKS else len(TASKS)


def fmt(x, nd=2):
    return "" if x is None else f"{x:.{nd}f}"


def cell_text(c):
    if c is None:
        return "–"
    if c["std"] is None:
        return f"{c['mean']:.2f} (n={c['n']})"
    return f"{c['mean']:.2f} ± {c['std']:.2f} (n={c['n']})"


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def run_line(run_dir, metric=None):
    """One run in one line, for the end of the task scripts: its best dev score and where. ``metric`` (the
    seq2seq script's bleu): that metric, and each other validated subset's at the same update."""
    log = os.path.join(run_dir, "train.log")
    valid, last = parse_log(log)
    entries = valid.get("valid", [])
    given = metric is not None
    metric = metric or ("glue_avg" if any("glue_avg" in e for e in entries) else primary_metric(
        os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(run_dir))))))
    budget = run_budget(entries)
    best, at = best_of(entries, metric, budget)
    if best is None:
        if budget is not None and best_of(entries, metric)[0] is not None:
            return f"every one of its {len(entries)} validations forgot more than its forgetting budget {budget:g}"
        return f"no {metric} in its {len(entries)} validations" if entries else "no validation in its log"
    fgt = run_forgetting(at)
    there = [f"{subset} {metric} {to_float(e[metric]):g}" + (f" ({to_float(e[metric + '_delta']):+g} since θ*)" if
                                                             to_float(e.get(metric + "_delta")) is not None else "")
             for subset, e in (at.get(OTHERS) or {}).items() if given and to_float(e.get(metric)) is not None]
    return (f"best dev {metric} {best:g} at update {at.get('num_updates', '?')} of {last}"
            + ("" if budget is None else f" within its forgetting budget {budget:g}")
            + f" ({checkpoint_at(run_dir, entries, at, saved_checkpoints(log))}), "
            f"{len(entries)} validations" + ("" if fgt is None else f", forgetting there {fgt[1]:+.4g} "
                                                                   f"({label(fgt[0])} since θ*)")
            + (f"; there: {', '.join(there)}" if there else ""))


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
    args = ap.parse_args(argv)
    root = args.runs_dir
    if not os.path.isdir(root):
        sys.exit(f"summarize.py: error: {root}: no such directory")
    runs = [r for d in find_runs(root) for r in read_runs(d, root, args.forgetting_budget)]
    if not runs:
        sys.exit(f"summarize.py: error: no runs under {root} (expected <TASK>/<METHOD>/seed<N>/train.log)")
    runs.sort(key=lambda r: (order(r["task"]), r["method"], r["config"], str(r["seed"])))
    counted = [r for r in runs if r["status"] == "done" or args.include_unfinished]
    cells, variants, methods, rows, tasks = summarize(counted)
    out = args.out or root
    os.makedirs(out, exist_ok=True)

    # runs.csv
    run_fields = ["task", "method", "config", "k", "t0", "seed", "status", "metric", "best", "best_update", "other",
                  "mm", "validations", "last_update", "total_updates", "note", "path", "forgetting",
                  "forgetting_metric", "budget", "checkpoint"]
    write_csv(os.path.join(out, "runs.csv"), [dict(r, mm=r["mm"]) for r in runs], run_fields)
    # variants.csv
    write_csv(os.path.join(out, "variants.csv"), variants,
              ["task", "method", "config", "k", "t0", "metric", "mean", "std", "n", "seeds", "chosen"])
    # summary.csv: task x method
    fields = ["task", "metric"] + [f"{m}_{x}" for m in methods for x in ("mean", "std", "n", "config")]
    table = []
    avg = ["GLUE avg"] if any(("GLUE avg", m) in cells for m in methods) else []
    for row in rows + avg:
        metric = next((cells[(row, m)]["metric"] for m in methods if (row, m) in cells), None)
        line = {"task": row, "metric": {MM: "accuracy", "GLUE avg": ""}.get(
            row, primary_metric(row) if row in glue_tasks.TASKS or metric is None else metric)}
        for m in methods:
            c = cells.get((row, m))
            if c:
                line.update({f"{m}_mean": fmt(c["mean"], 4), f"{m}_std": fmt(c["std"], 4), f"{m}_n": c["n"],
                             f"{m}_config": c["config"]})
        table.append(line)
    write_csv(os.path.join(out, "summary.csv"), table, fields)

    # summary.md
    n_done = sum(r["status"] == "done" for r in runs)
    unfinished = [r for r in runs if r["status"] != "done"]
    glue_only = all(t in glue_tasks.TASKS for t in tasks)
    md = ["# GLUE dev results" if glue_only else "# Dev results", "",
          f"`{root}`: {len(runs)} run{'s' if len(runs) != 1 else ''}, {n_done} finished, {len(unfinished)} unfinished"
          + (" (counted: --include-unfinished)" if args.include_unfinished and unfinished else ""), "",
          "Best dev score over each run's validations (CoLA: mcc; MRPC, QQP: f1; STS-B: pearson; the others: "
          "accuracy; MNLI: matched, MNLI-mm: mismatched, not in the average" + ("" if glue_only else
          "; other tasks: the metric the run names, such as translation's bleu, not in GLUE's average")
          + "), mean ± std over seeds of the best config per task and method (by mean).", ""]
    if methods:
        md += ["| task | metric | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
        for line in table:
            row = line["task"]
            texts = []
            for m in methods:
                c = cells.get((row, m))
                if row == "GLUE avg":
                    n_all = sum(t in glue_tasks.TASKS for t in tasks)
                    texts.append("–" if c is None else f"{c['mean']:.2f}" + ("" if c["n"] == n_all else f" ({c['n']}/{n_all} tasks)"))
                else:
                    texts.append(cell_text(c))
            name = f"**{row}**" if row == "GLUE avg" else row
            md.append(f"| {name} | {line['metric']} | " + " | ".join(texts) + " |")
        md.append("")
    else:
        md += ["No finished run with a score yet.", ""]

    tuned = [v for v in variants if v["k"] not in ("", None)]  # the RecAdam methods: a (k, t0) each
    if tuned:
        md += ["## RecAdam: best (k, t0) per task", "", "Chosen by the mean over seeds.", "",
               "| task | method | k | t0 | config | mean ± std | configs tried |", "|---|---|---|---|---|---|---|"]
        for (task, method), c in sorted(cells.items(), key=lambda kv: (order(kv[0][0]), kv[0][1])):
            if c["k"] in ("", None) or task in (MM, "GLUE avg"):
                continue
            tried = sum(v["task"] == task and v["method"] == method for v in variants)
            md.append(f"| {task} | {method} | {c['k']} | {c['t0']} | {c['config']} | {cell_text(c)} | {tried} |")
        md.append("")
        grids = defaultdict(list)
        for v in tuned:
            grids[(v["task"], v["method"])].append(v)
        for (task, method), vs in sorted(grids.items(), key=lambda kv: (order(kv[0][0]), kv[0][1])):
            plain = [v for v in vs if only_k_t0(v["method"], v["config"])]
            if len(plain) < 2:
                continue
            ks = sorted({v["k"] for v in plain}, key=num_key)
            t0s = sorted({v["t0"] for v in plain}, key=num_key)
            at = {(v["k"], v["t0"]): v for v in plain}
            md += [f"### {task} {method}: mean {plain[0]['metric']} per (k, t0)", "",
                   "| k \\ t0 | " + " | ".join(t0s) + " |", "|---|" + "---|" * len(t0s)]
            for k in ks:
                cols = []
                for t0 in t0s:
                    v = at.get((k, t0))
                    cols.append("" if v is None else (f"**{v['mean']:.2f}**" if v["chosen"] else f"{v['mean']:.2f}")
                                + ("" if v is None else f" ({v['n']})"))
                md.append(f"| {k} | " + " | ".join(cols) + " |")
            md.append("")

    if unfinished:
        md += ["## Unfinished runs", "", "| run | status | updates | best so far | note |", "|---|---|---|---|---|"]
        for r in unfinished:
            upd = f"{r['last_update']}/{r['total_updates']}" if r["total_updates"] != "" else str(r["last_update"])
            best = "" if r["best"] is None else f"{r['metric']} {r['best']:.2f}"
            md.append(f"| {r['path']} | {r['status']} | {upd} | {best} | {r['note']} |")
        md.append("")
    metered = [r for r in runs if r["forgetting"] is not None]
    if metered:
        budget = args.forgetting_budget
        md += ["## Forgetting at the chosen validation", "",
               "What each run lost from pretraining by its best validation (forgetting meter: the masked-LM loss's "
               "rise since θ*, or the pair AUC's fall; translation: BLEU's fall since θ* on the original domain's "
               "subset; positive = forgot)"
               + (f", the best among validations that forgot at most {budget:g}" if budget is not None else
                  ", within the run's own budget where it was trained with one") + ", and the file holding it.",
               "", "| run | metric | best | update | forgetting | budget | probe | checkpoint |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['path']} | {r['metric']} | {fmt(r['best'])} | {r['best_update']} | {r['forgetting']:+.4f} | "
               f"{'' if r['budget'] is None else format(r['budget'], 'g')} | {r['forgetting_metric']} | "
               f"{r['checkpoint']} |" for r in metered] + [""]
    noscore = [r for r in runs if r["status"] == "done" and r["best"] is None]
    if noscore:
        md += ["## Finished runs without a score", ""] + [f"- {r['path']}: {r['note']}" for r in noscore] + [""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    print(f"wrote {', '.join(os.path.join(out, n) for n in ('summary.md', 'summary.csv', 'variants.csv', 'runs.csv'))}")


def num_key(s):
    x = to_float(s)
    return (0, x, "") if x is not None else (1, 0.0, str(s))


if __name__ == "__main__":
    main()
