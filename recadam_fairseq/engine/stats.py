"""The figures the tables read: means and standard deviations over seeds, the frontiers (a setting is better
with higher accuracy and less forgetting), and the comparisons of a setting with Adam.

Two comparisons with Adam, each where the committed pages use it:

- on the means (``better_than_adam_on_means``): a task's own table ("Forget less than Adam at Adam's accuracy
  or above (means)", compare/report.py), for the settings and for the WiSE-FT points, which have no per-seed spread
  in the table;
- within the seed noise (``keeps_accuracy_within_noise`` and ``forgets_less_beyond_noise``): the summary
  across the tasks (its **✓**, the README's lists, compare/summary.py), where a gap counts only beyond twice its
  standard error over the seeds.

The second is the reading the docs draw conclusions from; the first states what the means show and says
so ("(means)"). Changing a task's table to the second would change the recorded pages, so both stay.

A row (a point: a setting's mean over its seeds, or a WiSE-FT mix) holds ``target_accuracy`` in its metric's units
and ``forgetting`` in its probe's, positive = forgot (the comparison's: the SNLI AUC's fall since θ*, whose pages
print its change, ΔAUC; a grid's: what its meter measured, engine/verdicts.py), each with its ``_std`` over
``seeds`` (None for one).
"""

import numpy as np

from recadam_fairseq.engine.settings import KNOB_NAMES, group

NOISE_FLOOR = 0.005  # accuracy and ΔAUC gaps below this are never read as differences


def mean_std(values):
    """(mean, standard deviation over seeds) of the values given (None: not measured); one value has no spread
    (None, not 0: only the noise floors stand for the noise then); (None, None) for none. Every table's."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None, None
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else None


def mean_std_text(mean, std, seeds: int, spec: str) -> str:
    """``mean ± std`` over seeds (``spec``: the mean's format, e.g. ``+.4f``); one seed has no spread,
    which ``± 0`` would misreport as agreement."""
    return f"{mean:{spec}} " + (f"± {std:{spec.lstrip('+')}}" if seeds > 1 and std is not None else "(1 seed)")


STATS = ("target_accuracy", "snli_auc", "forgetting", "dist", "train_seconds")


def point_stats(row, points, base):
    for key in STATS:
        vals = [base["snli_auc"] - p["snli_auc"] if key == "forgetting" else p.get(key) for p in points]
        row[key], row[key + "_std"] = mean_std(vals)
    if all("task_accuracy" in p for p in points):  # the multi-task setting: each task's accuracy, mean over seeds
        row["task_accuracy"] = {t: float(np.mean([p["task_accuracy"][t] for p in points]))
                                for t in points[0]["task_accuracy"]}
    return row


def summarize(runs, base):
    """One row per setting (mean and std over seeds), then the intermediate points of its runs."""
    rows = []
    for name in dict.fromkeys(r["name"] for r in runs):
        rs = [r for r in runs if r["name"] == name]
        row = {k: v for k, v in rs[0].items() if k == "method" or k in KNOB_NAMES}
        row.update(name=name, label=rs[0]["label"], seeds=sorted(r["seed"] for r in rs))
        rows.append(point_stats(row, rs, base))
        for updates in sorted({e["updates"] for r in rs for e in r.get("early", [])}):
            es = [dict(e, train_seconds=None) for r in rs for e in r.get("early", []) if e["updates"] == updates]
            rows.append(point_stats(dict(row, name=f"{name}@{updates}", stopped_at=updates, seeds=row["seeds"][:len(es)]),
                               es, base))
        wise = interpolated(rs, base)
        if wise:  # rows of runs measured without interpolation have no such key
            row["interpolated"] = wise
    frontier(rows)
    return rows


INTERPOLATED_STATS = ("target_accuracy", "snli_auc", "forgetting", "dist")


def interpolated(runs, base):
    """The interpolations of a setting's runs: per α, mean and std over the seeds measured at it."""
    out = []
    for alpha in sorted({p["alpha"] for r in runs for p in r.get("interpolated", [])}):
        ps = [(r["seed"], p) for r in runs for p in r.get("interpolated", []) if p["alpha"] == alpha]
        point = {"alpha": alpha, "seeds": sorted(seed for seed, _ in ps)}
        for key in INTERPOLATED_STATS:
            vals = [base["snli_auc"] - p["snli_auc"] if key == "forgetting" else p[key] for _, p in ps]
            point[key], point[key + "_std"] = mean_std(vals)
        out.append(point)
    return out


def frontier(rows):
    """Mark the settings no other setting beats on both axes (accuracy up, forgetting down): the
    frontier over all methods (``frontier``) and within the row's method (``method_frontier``)."""
    final = [r for r in rows if not r.get("stopped_at")]
    for r in final:
        r["frontier"] = not dominated(r, final)
        r["method_frontier"] = not dominated(r, [q for q in final if group(q) == group(r)])


def dominates(q, r):
    """``q`` is at least as good as ``r`` on both axes (accuracy up, forgetting down) and better on one."""
    return (q["target_accuracy"] >= r["target_accuracy"] and q["forgetting"] <= r["forgetting"]
            and (q["target_accuracy"] > r["target_accuracy"] or q["forgetting"] < r["forgetting"]))


def dominated(r, among):
    """Some other setting of ``among`` dominates ``r``."""
    return any(q is not r and dominates(q, r) for q in among)


def pareto_ranks(rows):
    """{name: its non-dominated sorting layer (1 = the frontier)} over (accuracy up, forgetting down)."""
    left, ranks, layer = list(rows), {}, 1
    while left:
        front = [r for r in left if not dominated(r, left)]
        for r in front:
            ranks[r["name"]] = layer
        left = [r for r in left if r["name"] not in ranks]
        layer += 1
    return ranks


def better_than_adam_on_means(p, adam):
    """``p`` (a setting's row or a WiSE-FT point) at Adam's mean accuracy or above, forgetting less than
    Adam's mean: a task's own table (no noise rule: see the module's docstring)."""
    return p["target_accuracy"] >= adam["target_accuracy"] and p["forgetting"] < adam["forgetting"]


def beats_adam(rows):
    """(Adam's row, the final settings better than Adam on the means) of a task's rows; (None, []) without Adam."""
    adam = next((r for r in rows if r["name"] == "adam"), None)
    if adam is None:
        return None, []
    return adam, [r for r in rows if not r.get("stopped_at") and r is not adam and better_than_adam_on_means(r, adam)]


def wise_beats_adam(rows, adam):
    """(row, interpolation) at Adam's accuracy or above that forget less than Adam (means over seeds)."""
    return [(r, p) for r in rows if not r.get("stopped_at") for p in r.get("interpolated", [])
            if better_than_adam_on_means(p, adam)]


def noise(row, adam, key, floor=NOISE_FLOOR):
    """Twice the standard error of the gap between a setting's mean and Adam's (at least ``floor``: NOISE_FLOOR
    in the comparison's units; a grid's summary passes it in its metric's, engine/verdicts.py)."""
    se = np.sqrt((row[key + "_std"] or 0.0) ** 2 / len(row["seeds"]) + (adam[key + "_std"] or 0.0) ** 2 / len(adam["seeds"]))
    return max(2 * float(se), floor)


def keeps_accuracy_within_noise(row, adam, floor=NOISE_FLOOR):
    """The setting's mean accuracy is at most the seed noise below Adam's: the summary's reading."""
    return row["target_accuracy"] - adam["target_accuracy"] >= -noise(row, adam, "target_accuracy", floor)


def forgets_less_beyond_noise(row, adam, floor=NOISE_FLOOR):
    """The setting's mean forgetting is below Adam's by more than the seed noise: the summary's reading."""
    return adam["forgetting"] - row["forgetting"] > noise(row, adam, "forgetting", floor)


def spread(row, key):
    """The largest difference between two seeds' values, from the std over n seeds (n = 2: |a − b|)."""
    n = len(row["seeds"])
    std = row[key + "_std"] or 0.0  # (one value measured: no spread)
    return std * np.sqrt(2) if n == 2 else 0.0 if n < 2 else 2 * std


def compute_seconds(runs):
    return sum(r["train_seconds"] + r["measure_seconds"] for r in runs)
