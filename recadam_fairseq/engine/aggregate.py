"""The picks: a run's validation (its task's metric, within a forgetting budget), a method's config (the best
mean over seeds), the task x method cells and the GLUE average. Pure Python, on what ``read`` parsed."""

import math
import statistics
from collections import defaultdict

from recadam_fairseq import catalogue
from recadam_fairseq.core import glue_tasks
from recadam_fairseq.core.forgetting import BUDGET, forgetting, within_budget
from recadam_fairseq.engine.stats import mean_std

TASKS = glue_tasks.RECIPE_TASKS
METHODS = catalogue.names()  # the run directories' methods, in the catalogue's order
MM = "MNLI-mm"
OTHERS = "_others"  # a valid entry's key for {subset: entry} of the other subsets validated at its update


def primary_metric(task):
    return glue_tasks.TASKS[task].primary_metric if task in glue_tasks.TASKS else "accuracy"


def to_float(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def run_budget(entries):
    """The --forgetting-budget the run was trained with (the meter logs it at each validation), or None."""
    return next((b for b in (to_float(e.get(BUDGET)) for e in reversed(entries)) if b is not None), None)


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


def num_key(s):
    x = to_float(s)
    return (0, x, "") if x is not None else (1, 0.0, str(s))
