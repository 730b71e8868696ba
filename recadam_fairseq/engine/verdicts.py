"""A grid's answer to the toolkit's question, which method keeps my accuracy and forgets least, from runs that
logged a forgetting probe (FORGETTING_PROBE, docs/forgetting-meter.md; translation: --eval-bleu-start's BLEU on
the original domain): per task, each setting (method and config) at the validation ``read`` picks (the best dev
metric, within a forgetting budget where one applies: the one summary.md's tables show), mean ± std over seeds;
Adam's curve along its validations; the frontier; and the comparison's verdicts against Adam, by its rule
(``engine/stats.py``, docs/forgetting.md): keeps Adam's accuracy within the seed noise, forgets less beyond it,
on the frontier. The rows are the comparison's points (engine/stats.py: ``target_accuracy`` in the metric's units,
``forgetting`` in the probe's, positive = forgot), so ``engine/plot.py`` draws them: summarize.py writes
forgetting-<TASK>.png, verdicts.csv and summary.md's section. Runs without a probe give nothing here."""

import os
import re
from collections import defaultdict

from recadam_fairseq import catalogue
from recadam_fairseq.core.glue_tasks import TASKS as GLUE_TASKS, head_name
from recadam_fairseq.engine import stats
from recadam_fairseq.engine.aggregate import order, run_forgetting, to_float
from recadam_fairseq.engine.fairseq_log import parse_log
from recadam_fairseq.engine.plot import CHART_MIN_ACCURACY  # (matplotlib is imported when drawing)
from recadam_fairseq.engine.read import MTL
from recadam_fairseq.engine.settings import METHODS

# every metric a grid is scored by is logged x100 (GLUE's: glue_core; BLEU): the comparison's floor, in its units
SCALE = 100.0


def floors(forgetting_metric):
    """(the metric's floor, the forgetting's floor): NOISE_FLOOR in the metric's units (0.5 points); the forgetting's
    in the probe's own (mlm loss bits, pair AUC), or BLEU's x100."""
    return stats.NOISE_FLOOR * SCALE, stats.NOISE_FLOOR * (SCALE if forgetting_metric.startswith("BLEU") else 1.0)


def knobs(method, config):
    """A setting's knobs as the comparison's rows hold them (its plot labels and groups by them): named by the run's
    directory, else the catalogue's defaults."""
    named = catalogue.parse_run_name(f"{method}-{config}" if config else method)[1]
    out = {}
    for k in METHODS.get(method, ()):
        knob = catalogue.KNOBS[k]
        value = named.get(k, knob.default)
        try:
            out[k] = knob.type(value)
        except (TypeError, ValueError):
            out[k] = value
    return out


def setting_row(name, method, rs, **extra):
    """One point: the mean ± std over ``rs`` ([(seed, metric, forgetting)], forgetting positive = forgot)."""
    row = dict(extra, name=name, label=name, method=method, seeds=sorted(s for s, _, _ in rs))
    row["target_accuracy"], row["target_accuracy_std"] = stats.mean_std([a for _, a, _ in rs])
    row["forgetting"], row["forgetting_std"] = stats.mean_std([f for _, _, f in rs])
    return row


def wise_rows(name, method, points):
    """WiSE-FT points of a setting ([(seed, α, metric, forgetting)], forgetting positive = forgot): per α, one
    ``setting_row`` over the seeds measured at it (its ``interpolated``, which engine/plot.py joins to its point)."""
    return [setting_row(f"{name} α={a:g}", method, [(s, m, f) for s, b, m, f in points if b == a], alpha=a)
            for a in sorted({b for _, b, _, _ in points})]


def multitask(run) -> bool:
    """A row of a multi-task run (scripts/glue/multitask.sh's RUNS_DIR/MTL/<NAME>/seed<N>)."""
    return run["path"].split(os.sep)[0] == MTL


def metric_key(run):
    """The run's metric as its validations log it: a multi-task run's under its task's head."""
    return f"{head_name(run['task'])}_{run['metric']}" if multitask(run) else run["metric"]


def adam_curve(adam_runs, root):
    """Adam's points along its validations: per update, the mean over the seeds that logged both its metric and
    its forgetting there (intermediate rows: ``stopped_at``)."""
    at = defaultdict(list)
    for r in adam_runs:
        entries = parse_log(os.path.join(root, r["path"], "train.log"))[0].get("valid", [])
        for e in entries:
            x, f, n = to_float(e.get(metric_key(r))), run_forgetting(e), to_float(e.get("num_updates"))
            if x is not None and f is not None and n is not None:
                at[int(n)].append((r["seed"], x, f[1]))
    return [setting_row(f"adam@{n}", "adam", at[n], stopped_at=n) for n in sorted(at)]


def task_answer(task, runs, root, reference=None):
    """One task's rows (settings, Adam's curve), its verdicts and texts; None without a metered, scored run of a
    catalogue's method (a run directory not named by one, read from run.json alone, has no place in the figure).
    ``reference``: the setting the others are judged against (default: Adam's, :func:`adam_row`)."""
    scored = [r for r in runs if r["best"] is not None and r["forgetting"] is not None
              and r["method"] in catalogue.METHODS]
    if not scored:
        return None
    by_setting = defaultdict(list)
    for r in scored:
        by_setting[(r["method"], r["config"])].append(r)
    rows = []
    for (method, config), rs in sorted(by_setting.items(), key=lambda kv: (catalogue.position(kv[0][0]), kv[0])):
        name = f"{method}-{config}" if config else method
        ups = [to_float(r["best_update"]) for r in rs if to_float(r["best_update"]) is not None]
        rows.append(setting_row(name, method, [(r["seed"], r["best"], r["forgetting"]) for r in rs], config=config,
                                at_update=sum(ups) / len(ups) if ups else None, **knobs(method, config)))
    adam = adam_row(rows, reference)
    if adam is not None:  # WiSE-FT of Adam's runs (summarize.py --wise-ft): per α, the mean over its seeds
        points = wise_rows(adam["name"], "adam", [(r["seed"], p["alpha"], p["best"], p["forgetting"])
                                                  for r in by_setting[(adam["method"], adam["config"])]
                                                  for p in r["wise"]])
        if points:
            adam["interpolated"] = points
    curve = adam_curve([r for r in scored if r["method"] == "adam" and r["config"] == adam["config"]], root) \
        if adam is not None else []
    return judge(task, scored[0]["metric"], scored[0]["forgetting_metric"], rows, curve,
                 max((to_float(r["last_update"]) or 0 for r in scored), default=0), add_adam=adam_command(task, scored),
                 reference=reference)


def adam_command(task, runs):
    """How a user adds Adam's runs beside one task's ``runs``, in the script that made them: grid.sh's METHODS for a
    GLUE task; multitask.sh and scripts/seq2seq/finetune.sh take one METHOD and one SEED a run."""
    seeds = " ".join(f"SEED={s}" for s in sorted({str(r["seed"]) for r in runs}, key=lambda s: (len(s), s)))
    if multitask(runs[0]):
        return (f"To add them: METHOD=adam scripts/glue/multitask.sh with these runs' TASKS, FORGETTING_PROBE and "
                f"other variables, once for each of {seeds}.")
    if task in GLUE_TASKS:
        return f"To add them: METHODS=\"adam ...\" scripts/glue/grid.sh {task} with the grid's other variables."
    return (f"To add them: scripts/seq2seq/finetune.sh adam with these runs' DATA, PRETRAINED and other variables, "
            f"once for each of {seeds}.")


def adam_row(rows, reference=None):
    """The setting the others are judged against: ``reference`` (a search's: Adam's best-metric pick), else Adam at
    its defaults, else Adam's first setting; None without."""
    if reference is not None:
        return next((r for r in rows if r["name"] == reference), None)
    return next((r for r in rows if r["name"] == "adam"), next((r for r in rows if r["method"] == "adam"), None))


def judge(task, metric, forgetting_metric, rows, curve=(), updates=0, at="its best validation", add_adam="",
          reference=None):
    """The answer of one task's settings (``setting_row``s, WiSE-FT points under ``interpolated``): the frontier,
    each setting's Pareto rank and, against Adam, the noise-aware verdicts (engine/stats.py's rule, the floors in
    the metric's units; ``at``: where each setting was read, for the figure; ``add_adam``: the command that adds
    Adam's runs, said when there are none). The grid's summary and the translation comparison both read their rows
    through it."""
    stats.frontier(rows)
    ranks = stats.pareto_ranks(rows)
    adam = adam_row(rows, reference)
    acc_floor, fgt_floor = floors(forgetting_metric)
    for r in rows:
        r["rank"] = ranks[r["name"]]
        for p in ([r] if r is not adam else []) + r.get("interpolated", []):  # WiSE-FT points too
            if adam is not None:
                p["d_accuracy"] = p["target_accuracy"] - adam["target_accuracy"]
                p["d_forgetting"] = p["forgetting"] - adam["forgetting"]  # positive: forgets more than Adam
                p["keeps_accuracy"] = stats.keeps_accuracy_within_noise(p, adam, acc_floor)
                p["forgets_less"] = stats.forgets_less_beyond_noise(p, adam, fgt_floor)
    return {"task": task, "metric": metric, "forgetting_metric": forgetting_metric, "rows": rows,
            "curve": list(curve), "adam": adam, "floors": (acc_floor, fgt_floor), "updates": updates, "at": at,
            "add_adam": add_adam}


def answer(runs, root, reference=None):
    """{task: task_answer} of the tasks with metered runs, in the tables' order; {} when no run logged a probe.
    ``reference``: the setting judged against (a search's; default: Adam's)."""
    tasks = sorted({r["task"] for r in runs}, key=lambda t: (order(t), t))
    out = {t: task_answer(t, [r for r in runs if r["task"] == t], root, reference) for t in tasks}
    return {t: a for t, a in out.items() if a is not None}


def yes(x):
    return "" if x is None else "yes" if x else "no"


def text(x, spec):
    """A figure in ``spec``, or empty when there is none (one seed's spread)."""
    return "" if x is None else f"{x:{spec}}"


def csv_rows(answers):
    """verdicts.csv's lines: one per (task, setting); forgetting positive = forgot, as runs.csv's."""
    out = []
    for a in answers.values():
        for r in a["rows"]:
            out.append({"task": a["task"], "setting": r["name"], "method": r["method"], "config": r["config"],
                        "seeds": " ".join(map(str, r["seeds"])), "metric": a["metric"],
                        "mean": f"{r['target_accuracy']:.4f}", "std": text(r["target_accuracy_std"], ".4f"),
                        "forgetting": f"{r['forgetting']:.5f}", "forgetting_std": text(r["forgetting_std"], ".5f"),
                        "forgetting_metric": a["forgetting_metric"],
                        "d_metric": "" if "d_accuracy" not in r else f"{r['d_accuracy']:+.4f}",
                        "d_forgetting": "" if "d_forgetting" not in r else f"{r['d_forgetting']:+.5f}",
                        "keeps_accuracy": yes(r.get("keeps_accuracy")), "forgets_less": yes(r.get("forgets_less")),
                        "frontier": yes(r["frontier"]), "rank": r["rank"]})
    return out


CSV_FIELDS = ["task", "setting", "method", "config", "seeds", "metric", "mean", "std", "forgetting", "forgetting_std",
              "forgetting_metric", "d_metric", "d_forgetting", "keeps_accuracy", "forgets_less", "frontier", "rank"]


def winners(a):
    """The settings that keep Adam's accuracy within the noise and forget less beyond it, frontier ones first."""
    both = [r for r in a["rows"] if r.get("keeps_accuracy") and r.get("forgets_less")]
    return sorted(both, key=lambda r: (r["rank"], r["forgetting"]))


def markdown(answers):
    """summary.md's section: per task, the verdicts table and the answer in one line."""
    if not answers:
        return []
    md = ["## Which method forgets least", "",
          "Each setting at the validation the tables above pick (the best dev metric, within the forgetting budget "
          "where one applies), mean ± std over seeds; forgetting: what the probe lost since θ* there (positive = "
          "forgot). Against Adam by the comparison's rule (docs/forgetting.md): **keeps** Adam's accuracy when "
          "its mean is above Adam's minus twice the standard error of the gap over the seeds, **forgets less** "
          "when its forgetting is below Adam's by more than twice that (each gap at least a floor: 0.5 points of "
          "the metric, 0.005 of the probe's unit, 0.5 BLEU); **frontier**: no other setting has a higher metric "
          "and less forgetting (rank 2: on it once those are removed). The plot: forgetting-<TASK>.png.", ""]
    for a in answers.values():
        md += [f"### {a['task']}: dev {a['metric']} against forgetting ({a['forgetting_metric']} since θ*)", "",
               f"![{a['task']}: dev {a['metric']} against forgetting]({plot_name(a['task'])})", ""]
        md += task_markdown(a)
    return md


WISE_TEXT = ("each run's weights at that validation mixed with θ* (summarize.py --wise-ft), scored as the runs "
             "score themselves")


def _against_adam(p):
    """A point's cells from its metric to its gaps to Adam (the settings' table and the WiSE-FT one)."""
    n = len(p["seeds"])
    return (f"{stats.mean_std_text(p['target_accuracy'], p['target_accuracy_std'], n, '.2f')} | "
            f"{stats.mean_std_text(p['forgetting'], p['forgetting_std'], n, '+.4f')} | "
            + ("" if "d_accuracy" not in p else f"{p['d_accuracy']:+.2f}") + " | "
            + ("" if "d_forgetting" not in p else f"{p['d_forgetting']:+.4f}"))


def task_markdown(a, wise_text=WISE_TEXT):
    """One task's verdicts table and its answer in one line (the grid's summary; the translation comparison's
    page)."""
    fl = a["floors"]
    md = [f"| setting | seeds | {a['metric']} | forgetting | Δ{a['metric']} vs adam | Δforgetting vs adam | "
          "keeps Adam's accuracy | forgets less | frontier (rank) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in a["rows"]:
        md.append(f"| {r['name']} | {len(r['seeds'])} | {_against_adam(r)} | "
                  + ("(Adam)" if r is a["adam"] else yes(r.get("keeps_accuracy"))) + " | "
                  + ("" if r is a["adam"] else yes(r.get("forgets_less"))) + " | "
                  + ("yes" if r["frontier"] else "no") + f" ({r['rank']}) |")
    md.append("")
    wise = [(r, p) for r in a["rows"] for p in r.get("interpolated", [])]
    if wise:
        md += [f"WiSE-FT, (1 − α)·θ* + α·θ: {wise_text}; judged against Adam by the same rule:", "",
               f"| WiSE-FT of | α | seeds | {a['metric']} | forgetting | Δ{a['metric']} vs adam | Δforgetting vs adam | "
               "keeps Adam's accuracy | forgets less |", "|---|---|---|---|---|---|---|---|---|"]
        for r, p in wise:
            md.append(f"| {r['name']} | {p['alpha']:g} | {len(p['seeds'])} | {_against_adam(p)} | "
                      + yes(p.get("keeps_accuracy")) + " | " + yes(p.get("forgets_less")) + " |")
        md.append("")
    if a["adam"] is None:
        return md + [" ".join(filter(None, ["No adam runs with the probe: no verdicts against Adam.", a.get("add_adam")])),
                     ""]
    if all(r is a["adam"] for r in a["rows"]):  # nothing but Adam's runs: no setting to weigh against it
        return md + ["**Answer**: nothing to compare Adam with: no other method's runs logged the probe (run them "
                     "beside Adam's with the same probe, e.g. METHODS=\"adam recadam llrd\" for grid.sh).", ""]
    best = winners(a)
    # one seed everywhere: no spread to measure, the floors alone stand for the noise (and the line says so)
    one_seed = all(len(r["seeds"]) <= 1 for r in a["rows"])
    noise = "the floors" if one_seed else "the seed noise"
    return md + [("**Answer**: " + ", ".join(f"{r['name']} ({'on' if r['frontier'] else 'off'} the frontier)"
                                             for r in best)
                  + " keep" + ("s" if len(best) == 1 else "") + f" Adam's accuracy within {noise} and forget"
                  + ("s" if len(best) == 1 else "") + " less beyond it." if best else
                  f"**Answer**: no setting keeps Adam's accuracy within {noise} and forgets less beyond it.")
                 + f" (Floors: {fl[0]:g} {a['metric']}, {fl[1]:g} forgetting"
                 + ("; one seed a setting: only the floors stand for the noise, run two or more seeds.)" if one_seed
                    else ".)"), ""]


def plot_name(task):
    return "forgetting-" + re.sub(r"[^\w.-]", "_", task) + ".png"


def plot(out, answers):
    """forgetting-<TASK>.png in ``out`` per task; the files written ([] without matplotlib)."""
    paths = [os.path.join(out, plot_name(a["task"])) for a in answers.values()]
    return [p for p, a in zip(paths, answers.values()) if plot_one(a, p)]


def plot_one(a, path):
    """One task's answer drawn at ``path`` (engine/plot.py's figure); False without matplotlib."""
    from recadam_fairseq.engine import plot as figures

    return figures.plot(a["rows"] + a["curve"], None, path, a["updates"], figure_text(a)) is not None


def figure_text(a):
    """The figure's texts (engine/plot.py's comparison_text's keys) of one task's answer."""
    return {"x": f"forgetting: {a['forgetting_metric']} since θ*, positive = forgot (each setting at "
                 f"{a['at']})", "y": f"dev {a['metric']}",
            "drop": f"forgetting ({a['forgetting_metric']})",
            "title": f"{a['task']}: dev {a['metric']} vs forgetting, one panel per family of methods",
            # a diverged run leaves the panels' scale, in the metric's units (x100): an accuracy's; a correlation's
            # chance is 0, a diverged F1 can be high (every example positive), BLEU has none
            "min_accuracy": CHART_MIN_ACCURACY * SCALE if a["metric"] == "accuracy" else None}
