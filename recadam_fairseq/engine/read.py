"""The runs under a directory and what each says: its path and name (the catalogue's parse_run_name), run.json,
fairseq's ``--log-format json`` log (train.log) and its saved checkpoints, read into one row per run (per task, for
a multi-task run) at the validation ``aggregate`` picks."""

import json
import os
import re
import sys

from recadam_fairseq import catalogue
from recadam_fairseq.core import glue_tasks
from recadam_fairseq.core.forgetting import label
from recadam_fairseq.core.glue_tasks import head_name
from recadam_fairseq.engine.aggregate import TASKS, best_of, primary_metric, run_budget, run_forgetting, to_float
from recadam_fairseq.engine.fairseq_log import parse_log

OTHER = {n: list(t.other_metrics) for n, t in glue_tasks.TASKS.items()}
MTL = "MTL"  # directory of multi-task runs (scripts/glue/multitask.sh): MTL/<NAME>/seed<N>


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
        "path": rel, "forgetting": None, "forgetting_metric": "", "budget": budget, "checkpoint": "", "wise": [],
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
        run["wise"] = wise_points(run_dir, run["checkpoint"], metric)
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
    fgt = run_forgetting(at)  # the forgetting at the validation every task is read at
    base["forgetting_metric"], base["forgetting"] = (label(fgt[0]), fgt[1]) if fgt is not None else ("", None)
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


WISE = "wise-ft.json"  # tools/wise_points.py's file in a run directory (summarize.py --wise-ft)


def wise_points(run_dir, checkpoint, metric):
    """The WiSE-FT points recorded for the run's chosen checkpoint: [{alpha, best, forgetting}] ([] for none)."""
    try:
        with open(os.path.join(run_dir, WISE)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return []
    if not checkpoint or saved.get("identity", {}).get("checkpoint") != checkpoint:
        return []
    return [{"alpha": p["alpha"], "best": p["metrics"].get(metric), "forgetting": p["forgetting"]}
            for p in saved.get("points", []) if p["metrics"].get(metric) is not None and p["forgetting"] is not None]


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
