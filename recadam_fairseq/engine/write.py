"""The summary's files: runs.csv (one line per run), variants.csv (every config), summary.csv and summary.md (the
task x method table, the best (k, t0), the grids, the unfinished runs, the forgetting); and one run's line."""

import csv
import json
import os
from collections import defaultdict

from recadam_fairseq.core import glue_tasks
from recadam_fairseq.core.forgetting import moved
from recadam_fairseq.engine import verdicts
from recadam_fairseq.engine.aggregate import MM, OTHERS, best_of, num_key, order, primary_metric, run_budget, \
    run_forgetting, to_float
from recadam_fairseq.engine.fairseq_log import parse_log
from recadam_fairseq.engine.read import checkpoint_at, only_k_t0, saved_checkpoints


def fmt(x, nd=2):
    return "" if x is None else f"{x:.{nd}f}"


def cell_text(c):
    if c is None:
        return "–"
    if c["std"] is None:
        return f"{c['mean']:.2f} (n={c['n']})"
    return f"{c['mean']:.2f} ± {c['std']:.2f} (n={c['n']})"


def read_json(path):
    """The JSON at ``path``, None when there is no such file."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    """``obj`` as indented JSON and a newline, replacing ``path`` at once (a reader never sees half a file)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2) + "\n")
    os.replace(path + ".tmp", path)


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def run_metric(run_dir):
    """The metric run.json names (finetune.sh writes the task's: a user's task's from its labels.json), or None."""
    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
            return json.load(f).get("metric")
    except (OSError, ValueError, AttributeError):
        return None


def run_line(run_dir, metric=None):
    """One run in one line, for the end of the task scripts: its best dev score and where. ``metric`` (the
    seq2seq script's bleu): that metric, and each other validated subset's at the same update."""
    log = os.path.join(run_dir, "train.log")
    valid, last = parse_log(log)
    entries = valid.get("valid", [])
    given = metric is not None
    task = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(run_dir))))
    own = run_metric(run_dir) if task not in glue_tasks.TASKS else None  # a task of the user's: run.json's
    metric = metric or ("glue_avg" if any("glue_avg" in e for e in entries) else own or primary_metric(task))
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
    there = ([] if fgt is None else [f"{moved(*fgt)} since θ*"]) + there  # which way the forgetting went
    return (f"best dev {metric} {best:g} at update {at.get('num_updates', '?')} of {last}"
            + ("" if budget is None else f" within its forgetting budget {budget:g}")
            + f" ({checkpoint_at(run_dir, entries, at, saved_checkpoints(log))}), "
            f"{len(entries)} validations" + (f"; there: {', '.join(there)}" if there else ""))


RUN_FIELDS = ["task", "method", "config", "k", "t0", "seed", "status", "metric", "best", "best_update", "other",
              "mm", "validations", "last_update", "total_updates", "note", "path", "forgetting",
              "forgetting_metric", "budget", "checkpoint"]
VARIANT_FIELDS = ["task", "method", "config", "k", "t0", "metric", "mean", "std", "n", "seeds", "chosen"]


def summary_table(cells, methods, rows):
    """summary.csv's lines and fields: the task x method table (mean, std, seeds, config per method)."""
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
    return table, fields


def markdown(root, runs, summary, table, include_unfinished=False, budget=None):
    """summary.md's lines."""
    cells, variants, methods, rows, tasks = summary
    n_done = sum(r["status"] == "done" for r in runs)
    unfinished = [r for r in runs if r["status"] != "done"]
    glue_only = all(t in glue_tasks.TASKS for t in tasks)
    md = ["# GLUE dev results" if glue_only else "# Dev results", "",
          f"`{root}`: {len(runs)} run{'s' if len(runs) != 1 else ''}, {n_done} finished, {len(unfinished)} unfinished"
          + (" (counted: --include-unfinished)" if include_unfinished and unfinished else ""), "",
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
    return md


def write_summary(out, root, runs, summary, include_unfinished=False, budget=None, answers=None, head=()):
    """The four files written into ``out`` from the runs and ``aggregate.summarize``'s result; summary.md printed.
    ``answers`` (``verdicts.answer``: runs with a probe): verdicts.csv, forgetting-<TASK>.png and summary.md's
    section besides; ``head``: summary.md's first lines (a search's section)."""
    cells, variants, methods, rows, _ = summary
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "runs.csv"), [dict(r, mm=r["mm"]) for r in runs], RUN_FIELDS)
    write_csv(os.path.join(out, "variants.csv"), variants, VARIANT_FIELDS)
    table, fields = summary_table(cells, methods, rows)
    write_csv(os.path.join(out, "summary.csv"), table, fields)
    md = list(head) + markdown(root, runs, summary, table, include_unfinished, budget) + verdicts.markdown(answers or {})
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    written = [os.path.join(out, n) for n in ('summary.md', 'summary.csv', 'variants.csv', 'runs.csv')]
    if answers:
        written.append(os.path.join(out, "verdicts.csv"))
        write_csv(written[-1], verdicts.csv_rows(answers), verdicts.CSV_FIELDS)
        written += verdicts.plot(out, answers)
    print(f"wrote {', '.join(written)}")
