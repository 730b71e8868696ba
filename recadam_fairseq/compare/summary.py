"""Which method forgets least across the target tasks: the summary of the per-task results.

    python scripts/forgetting/summary.py          # reads docs/forgetting{,-tweets,-nli,-multi}.json

Reads each task's results (scripts/forgetting/run.py's ``--results`` JSON) and writes

- the summary table between the ``<!-- forgetting-summary:start -->`` / ``end`` lines of
  docs/forgetting.md: per method (at the setting the other tasks run, plan.TASK_METHODS), on how many
  tasks it reaches Adam's accuracy within seed noise with less forgetting, its mean rank on the
  frontier, its cost against Adam, and its accuracy / ΔAUC gap to Adam on every task;
- the multi-task comparison between the ``<!-- forgetting-multitask:start -->`` / ``end`` lines:
  one run on all the tasks at once (plain RoBERTa, CA-MTL without and with the lower half frozen,
  each with and without RecAdam) against one single-task run per task, the same total updates;
- the short form between the same summary markers of README.md;
- docs/forgetting-overview.png: every method's gap to Adam on every task, in one picture.

Within seed noise: the gap is smaller than twice its standard error over the seeds,
2·sqrt(s_m²/n_m + s_adam²/n_adam), and never counted below NOISE_FLOOR (two seeds can agree by chance).
Rank on the frontier: non-dominated sorting of the compared settings on the task (1 = on the frontier
over all methods, 2 = on it once those are removed, ...), a setting being better with higher accuracy
and less forgetting. A task whose results are missing or partial is left out and the table says so.
"""

import argparse
import os

import numpy as np

from recadam_fairseq.compare import plan, sdist_data
from recadam_fairseq.compare.files import ROOT, read_json, write_json
from recadam_fairseq.engine import methods
from recadam_fairseq.compare.report import delta_auc
from recadam_fairseq.engine.plot import overview_plot
from recadam_fairseq.engine.stats import mean_std_text
from recadam_fairseq.engine.stats import (NOISE_FLOOR, forgets_less_beyond_noise, keeps_accuracy_within_noise,
                                           pareto_ranks, spread)
from recadam_fairseq.tools import readme_block

SUMMARY = ("<!-- forgetting-summary:start -->", "<!-- forgetting-summary:end -->")
MULTITASK = ("<!-- forgetting-multitask:start -->", "<!-- forgetting-multitask:end -->")
TASKS = tuple(sdist_data.TARGETS)  # movie, tweets, nli


def task_settings():
    """({method: the setting name the tasks compare}, {method: its --methods spec}), from plan.TASK_METHODS."""
    specs = {methods.parse(s)["method"]: s for s in plan.TASK_METHODS}
    return {m: methods.setting_name(methods.parse(s)) for m, s in specs.items()}, specs


def multitask_settings():
    """The same for the multi-task table, keyed by spec (it runs some methods at two settings)."""
    return ({s: methods.setting_name(methods.parse(s)) for s in plan.MULTITASK_SETTINGS},
            {s: s for s in plan.MULTITASK_SETTINGS})


def settings_of(task):
    return multitask_settings() if task == plan.MULTI else task_settings()


def third_seed_specs(result, task):
    """The specs of TASK's settings whose two seeds disagree by more than their gap to Adam (compare)."""
    return [c["spec"] for c in compare(result, *settings_of(task)).values() if c["third_seed"]]


def results_path(prefix, task):
    return prefix + ("" if task == "movie" else f"-{task}") + ".json"


def final_rows(result):
    return [r for r in result["rows"] if not r.get("stopped_at")]


def compare(result, settings, specs=None):
    """{method: its row's gaps to Adam on one task} for the settings asked (name by method; ``specs``:
    their --methods specs, by method)."""
    specs = specs or {}
    rows = {r["name"]: r for r in final_rows(result)}
    adam = rows.get("adam")
    if adam is None:
        return {}
    ranks = pareto_ranks([rows[n] for n in settings.values() if n in rows])  # the same settings on every task
    out = {}
    for method, name in settings.items():
        r = rows.get(name)
        if r is None:
            continue
        # forgetting as engine/verdicts.py's rows hold it: positive = forgot, its gap positive = forgets more than Adam
        d_acc, d_fgt = r["target_accuracy"] - adam["target_accuracy"], r["forgetting"] - adam["forgetting"]
        out[method] = {
            "name": name, "spec": specs.get(method, name), "label": r["label"], "accuracy": r["target_accuracy"],
            "forgetting": r["forgetting"],
            "d_accuracy": d_acc, "d_forgetting": d_fgt, "seeds": len(r["seeds"]), "rank": ranks[name],
            "keeps_accuracy": keeps_accuracy_within_noise(r, adam),
            "forgets_less": forgets_less_beyond_noise(r, adam),
            "cost": r["train_seconds"] / adam["train_seconds"] if adam.get("train_seconds") else None,
        }
        out[method]["wins"] = out[method]["keeps_accuracy"] and out[method]["forgets_less"]
        # two seeds that disagree by more than the gap read from them: a third seed decides
        out[method]["third_seed"] = method != "adam" and len(r["seeds"]) < 3 and any(
            spread(r, key) > abs(gap) for key, gap in (("target_accuracy", d_acc), ("forgetting", d_fgt)))
    return out


def summarize(per_task):
    """{method: {tasks: {task: comparison}, wins, mean_rank, cost}} over the tasks given."""
    out = {}
    for spec in plan.TASK_METHODS:
        s = methods.parse(spec)
        m = s["method"]
        tasks = {t: c[m] for t, c in per_task.items() if m in c}
        if not tasks:
            continue
        costs = [c["cost"] for c in tasks.values() if c["cost"]]
        out[m] = {"tasks": tasks, "wins": sum(c["wins"] for c in tasks.values()),
                  "mean_rank": float(np.mean([c["rank"] for c in tasks.values()])),
                  "cost": float(np.mean(costs)) if costs else None, "label": methods.label(s)}
    return out


def delta_delta_auc(c):
    """The page's ΔΔAUC of a comparison: its ΔAUC minus Adam's (positive = forgets less), −d_forgetting."""
    return delta_auc({"forgetting": c["d_forgetting"]})


def summary_markdown(summary, tasks, missing):
    head = " | ".join(f"{t}: Δacc, ΔΔAUC" for t in tasks)
    lines = [f"| method (setting) | tasks where it keeps Adam's accuracy and forgets less | mean frontier rank | "
             f"time / Adam | {head} |",
             "|---|---|---|---|" + "---|" * len(tasks)]
    order = sorted(summary.items(), key=lambda kv: (-kv[1]["wins"], kv[1]["mean_rank"]))
    for m, s in order:
        cells = []
        for t in tasks:
            c = s["tasks"].get(t)
            cells.append("" if c is None else (f"{c['d_accuracy']:+.3f}, {delta_delta_auc(c):+.3f}"
                                               + (" **✓**" if c["wins"] else "")
                                               + (f" ({c['seeds']} seed)" if c["seeds"] < 2 else "")))
        cost = f"{s['cost']:.2f}×" if s["cost"] else ""
        lines.append(f"| {s['label']} | {s['wins']} of {len(s['tasks'])} | {s['mean_rank']:.1f} | {cost} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Δacc: the setting's held-out accuracy minus Adam's on that task; ΔΔAUC: its forgetting minus "
              "Adam's (positive = forgets less); means over seeds. **✓**: Δacc above −2 standard errors of the "
              f"gap and ΔΔAUC above +2 (each at least {NOISE_FLOOR}). Frontier rank: 1 = no other setting of this "
              "table has higher accuracy and less forgetting, 2 = on the frontier once those are removed, ...; "
              "among the settings compared here, mean over the tasks. \"(1 seed)\": its second seed is not recorded yet, "
              "so only the floor stands for the noise: provisional. Time: seconds per run against Adam's, mean over the tasks."]
    third = {t: [s["tasks"][t]["spec"] for s in summary.values() if s["tasks"].get(t, {}).get("third_seed")]
             for t in tasks}
    if any(third.values()):
        lines += ["", "Two seeds disagree by more than the gap to Adam: a third seed decides (`make forgetting`'s "
                  "second pass runs them as `run.py --task TASK --third-seed ...`): " + "; ".join(
                      f"{t}: {', '.join(v)}" for t, v in third.items() if v) + "."]
    if missing:
        lines += ["", "**Not yet in the summary:** " + "; ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def seed_range(rows):
    """'2', or '2–3' where the tasks' runs have different numbers of seeds."""
    n = sorted({len(r["seeds"]) for r in rows})
    return f"{n[0]}–{n[-1]}" if n[0] != n[-1] else str(n[0])


def multitask_markdown(multi, singles, tasks):
    """One run on every task against one single-task run per task (each task's own table)."""
    lines = ["| setting | " + " | ".join(f"{t} acc" for t in tasks) + " | mean acc | ΔAUC (forgetting) | seeds |",
             "|---|" + "---|" * (len(tasks) + 3)]
    for name, label in (("adam", "adam"), ("recadam-k0.1-t25-g5000", "recadam k=0.1 t0=25")):
        rows = [next((r for r in final_rows(singles[t]) if r["name"] == name), None) if singles.get(t) else None
                for t in tasks]
        if any(r is None for r in rows):
            continue
        f = [delta_auc(r) for r in rows]
        lines.append(f"| single-task runs ({label}), one model per task | "
                     + " | ".join(f"{r['target_accuracy']:.3f}" for r in rows)
                     + f" | {np.mean([r['target_accuracy'] for r in rows]):.3f} | {np.mean(f):+.4f} "
                       f"(per task {', '.join(f'{x:+.3f}' for x in f)}) | {seed_range(rows)} |")
    third = third_seed_specs(multi, plan.MULTI) if multi else []
    for r in final_rows(multi) if multi else []:
        per = r.get("task_accuracy", {})
        lines.append(f"| multi-task: {r['label']} | " + " | ".join(f"{per.get(t, float('nan')):.3f}" for t in tasks)
                     + f" | {r['target_accuracy']:.3f} | "
                     + mean_std_text(delta_auc(r), r["forgetting_std"], len(r["seeds"]), "+.4f")
                     + f" | {len(r['seeds'])} |")
    updates = multi["settings"]["updates"] if multi else None
    lines += ["", "Single-task runs: each task's own table (200 updates each, so "
              f"{200 * len(tasks)} in all); their forgetting is the mean of the three models'. Multi-task: one "
              f"model trained on all the tasks at once ({updates or 'the same total'} updates, uniform task "
              "sampling, `--task glue_multitask`), one forgetting figure. Means over seeds."]
    if third:
        lines += ["", "Two seeds disagree by more than the gap to multi-task Adam (mean accuracy or ΔAUC): a third "
                  "seed decides (`make forgetting`'s second pass): " + ", ".join(third) + "."]
    if not multi:
        lines += ["", "**The multi-task runs are not recorded yet** (`run.py --task multi`)."]
    return "\n".join(lines) + "\n"


def readme_markdown(summary, tasks, missing):
    """The README's short form: the methods grouped by on how many tasks they win, the best mean ranks."""
    lines = [f"Across {len(tasks)} target tasks ({', '.join(tasks)}), each method at its movie setting; "
             "keeps Adam's accuracy within seed noise and forgets less beyond it:"]
    for k in range(len(tasks), -1, -1):
        group = [(m, s) for m, s in summary.items() if s["wins"] == k]
        if group:
            names = ", ".join(m + (f" ({', '.join(t for t in tasks if s['tasks'].get(t, {}).get('wins'))})"
                                   if 0 < k < len(tasks) else "") for m, s in group)
            lines.append(f"- on {'none' if k == 0 else ('all ' if k == len(tasks) else '') + str(k)}"
                         f"{'' if k == 0 else ' of them'}: {names}")
    best = sorted(summary.items(), key=lambda kv: kv[1]["mean_rank"])[:5]
    lines.append("- best mean rank on the frontier: " + ", ".join(f"{m} ({s['mean_rank']:.1f})" for m, s in best))
    if missing:
        lines.append(f"- not yet in it: {'; '.join(missing)}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "forgetting"),
                    help="the prefix run.py wrote each task's results to (PREFIX.json, PREFIX-TASK.json); the "
                         "summary goes between the markers of PREFIX.md, the plot to PREFIX-overview.png")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"),
                    help="also write the short summary between its markers (empty: no README)")
    ap.add_argument("--third-seed-args", metavar="TASK", choices=TASKS + (plan.MULTI,),
                    help="print run.py's --third-seed arguments for TASK (the settings whose two seeds disagree by "
                         "more than their gap to Adam) and write nothing: make forgetting's second pass")
    ap.add_argument("--recorded-third-seed-args", metavar="TASK", choices=TASKS + (plan.MULTI,),
                    help="the same, only those recorded in TASK's results (make forgetting-report: no new run)")
    args = ap.parse_args(argv)
    md_path = args.results + ".md"
    if args.recorded_third_seed_args:
        res = read_json(results_path(args.results, args.recorded_third_seed_args)) or {}
        wanted = res.get("settings", {}).get("third_seed", [])
        print(" ".join(["--third-seed", *wanted]) if wanted else "")
        return wanted
    if args.third_seed_args:
        res = read_json(results_path(args.results, args.third_seed_args))
        found = third_seed_specs(res, args.third_seed_args) if res else []
        # those run before stay (with three seeds they no longer look undecided)
        wanted = list(dict.fromkeys((res or {}).get("settings", {}).get("third_seed", []) + found))
        print(" ".join(["--third-seed", *wanted]) if wanted else "")
        return wanted
    for path, marks, flag in ((md_path, SUMMARY, "--results"), (md_path, MULTITASK, "--results")) + (
            ((args.readme, SUMMARY, "--readme"),) if args.readme else ()):
        if err := readme_block.marker_problem(path, *marks, flag):  # before anything is written
            ap.error(err)
    per_task, results, missing = {}, {}, []
    for t in TASKS:
        res = read_json(results_path(args.results, t))
        if res is None:
            missing.append(f"{t} (no {os.path.relpath(results_path(args.results, t), ROOT)})")
            continue
        results[t] = res
        if not res.get("complete", False):
            missing.append(f"{t} (partial: {len(res['runs'])} runs recorded)")
        per_task[t] = compare(res, *task_settings())
    tasks = [t for t in TASKS if t in per_task]
    summary = summarize(per_task)
    md = summary_markdown(summary, tasks, missing)
    multi = read_json(results_path(args.results, plan.MULTI))
    readme_block.replace_block(md_path, *SUMMARY, md.rstrip("\n"), flag="--results")
    readme_block.replace_block(md_path, *MULTITASK, multitask_markdown(multi, results, tasks).rstrip("\n"),
                               flag="--results")
    if args.readme:
        readme_block.replace_block(args.readme, *SUMMARY, readme_markdown(summary, tasks, missing).rstrip("\n"),
                                   flag="--readme")
    overview_plot(summary, tasks, args.results + "-overview.png")
    write_json(args.results + "-summary.json",
               {"tasks": tasks, "missing": missing, "methods": summary, "noise_floor": NOISE_FLOOR})
    print(md)
    return summary


if __name__ == "__main__":
    main()
