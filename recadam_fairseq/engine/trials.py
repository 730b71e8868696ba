"""A search's trials (scripts/glue/tune.sh, launch/search.py), read by the engine's one rule: each method's front
(its trials no other of its trials beats on both axes: metric up, forgetting down; engine/stats.py's dominance), the
settings each method sends to be confirmed over seeds, ``trials.csv`` and the summary's search section.

A trial's record: ``method``, ``number`` (within its method's study), ``state`` (complete, failed, diverged,
refused, running), ``reason``, ``values`` ({variable: value as the run got it}: LR, K, T0, ...), ``metric`` and
``forgetting`` (its run at the validation the engine picks; positive = forgot) and ``run_dir``. Pure Python."""

from typing import Dict, List, Optional

from recadam_fairseq import catalogue
from recadam_fairseq.engine import stats

TRAINED = ("complete", "failed", "diverged")  # a trial that trained: its method's budget spent


def point(record: dict) -> dict:
    """A complete trial as stats' rows hold a setting (``target_accuracy``, ``forgetting``)."""
    return {"name": f"{record['method']}#{record['number']}", "target_accuracy": record["metric"],
            "forgetting": record["forgetting"], "record": record}


def fronts(records: List[dict]) -> Dict[str, List[dict]]:
    """{method: its front}: its complete trials that no other of its complete trials dominates, by metric (best
    first); a method without a complete trial has an empty front."""
    out = {}
    for method in dict.fromkeys(r["method"] for r in records):
        pts = [point(r) for r in records if r["method"] == method and r["state"] == "complete"]
        front = [p["record"] for p in pts if not stats.dominated(p, pts)]
        out[method] = sorted(front, key=lambda r: (-r["metric"], r["forgetting"], r["number"]))
    return out


def reference(records: List[dict]) -> Optional[dict]:
    """The trial the accuracy floor is measured from: Adam's best-metric trial, else (no Adam in the search) the best
    of any method's; None before any trial is complete."""
    done = [r for r in records if r["state"] == "complete"]
    pool = [r for r in done if r["method"] == "adam"] or done
    return max(pool, key=lambda r: (r["metric"], -r["forgetting"]), default=None)


def picks(records: List[dict], floor: float) -> Dict[str, List[dict]]:
    """{method: the settings confirmed over seeds}: from its front, the one that forgets least among those whose metric
    is within ``floor`` of :func:`reference`'s, then its best-metric one (once when they are the same trial). Each
    pick is its record with ``why``: ``least forgetting within the floor`` or ``best metric``."""
    ref = reference(records)
    out = {}
    for method, front in fronts(records).items():
        chosen = []
        within = [r for r in front if ref is not None and r["metric"] >= ref["metric"] - floor]
        if within:
            chosen.append(dict(min(within, key=lambda r: (r["forgetting"], -r["metric"], r["number"])),
                               why="least forgetting within the floor"))
        if front and all(c["number"] != front[0]["number"] for c in chosen):
            chosen.append(dict(front[0], why="best metric"))
        elif front:
            chosen[0]["why"] += ", best metric"
        out[method] = chosen
    return out


def knob_columns(records: List[dict]) -> List[str]:
    """The variables trials.csv has a column for: LR, then every knob's a trial set, in the catalogue's order."""
    seen = {v for r in records for v in r["values"]}
    return ["LR"] + [k.var for k in catalogue.KNOBS.values() if k.var in seen and k.var != "LR"]


def csv_rows(records: List[dict], front_of: Dict[str, List[dict]]):
    """trials.csv: one line a trial, in each method's order; its fields."""
    columns = knob_columns(records)
    on = {(r["method"], r["number"]) for front in front_of.values() for r in front}
    fields = ["method", "trial", "state", *columns, "metric", "forgetting", "front", "run_dir", "reason"]
    rows = []
    for r in records:
        rows.append({"method": r["method"], "trial": r["number"], "state": r["state"],
                     **{c: r["values"].get(c, "") for c in columns},
                     "metric": "" if r.get("metric") is None else f"{r['metric']:.4f}",
                     "forgetting": "" if r.get("forgetting") is None else f"{r['forgetting']:.6g}",
                     "front": "yes" if (r["method"], r["number"]) in on else "",
                     "run_dir": r.get("run_dir") or "", "reason": r.get("reason") or ""})
    return rows, fields


def settings_text(record: dict) -> str:
    """A trial's values in a line: ``LR=2.1e-05 K=0.23 T0=57``."""
    return " ".join(f"{k}={v}" for k, v in record["values"].items())


def front_text(front: List[dict]) -> str:
    """A front in a line: ``84.6/+0.031, 83.0/+0.012`` (metric/forgetting, best metric first)."""
    return ", ".join(f"{r['metric']:.4g}/{r['forgetting'] + 0.0:+.3g}" for r in front) or "none yet"  # (no -0)


def counts(records: List[dict], method: str) -> Dict[str, int]:
    """A method's trials by state."""
    out: Dict[str, int] = {}
    for r in records:
        if r["method"] == method:
            out[r["state"]] = out.get(r["state"], 0) + 1
    return out


def trained(records: List[dict], method: str) -> int:
    """A method's trials that trained (its budget spent): complete, failed or diverged."""
    return sum(n for state, n in counts(records, method).items() if state in TRAINED)


def markdown(records: List[dict], chosen: Dict[str, List[dict]], meta: dict) -> List[str]:
    """summary.md's search section: the budget, each method's trials by state, its front and its picks."""
    metric, fl = meta["metric"], meta["floor"]
    ref = reference(records)
    md = [f"# Search: {meta['task']}", "",
          f"Each method had the same budget: {meta['trials']} trials of {meta['updates']} updates (a refused trial, "
          f"stopped before training, does not count), proposed by Optuna's multi-objective TPE sampler (seed "
          f"{meta['seed']}), each trained with seed {meta['trial_seed']}; objectives: dev {metric} (up) and forgetting, "
          f"{meta['forgetting_metric']} since θ* (down), at the validation the summary picks. Searched: "
          + "; ".join(f"{m}: {s}" for m, s in meta["spaces"].items()) + ". Every trial: trials.csv, "
          f"{meta['figure']}.", ""]
    if ref is not None:
        md += [f"Each method's picks, from its front: the trial that forgets least among those within {fl:g} {metric} "
               f"of the reference ({ref['method']}'s best trial: {ref['metric']:.4g}), and its best-{metric} trial; "
               f"each confirmed over seeds {' '.join(map(str, meta['seeds']))} below (a seed-{meta['trial_seed']} "
               f"run is the trial's own).", ""]
    md += [f"| method | trials: complete / failed / refused | front ({metric}/forgetting) | picks |", "|---|---|---|---|"]
    front_of = fronts(records)
    short = []
    for method in meta["methods"]:
        c = counts(records, method)
        failed = c.get("failed", 0) + c.get("diverged", 0)
        picked = "; ".join(f"{r['setting']} ({r['why']})" for r in chosen.get(method, [])) or "none"
        md.append(f"| {method} | {c.get('complete', 0)} / {failed} / {c.get('refused', 0)} | "
                  f"{front_text(front_of.get(method, []))} | {picked} |")
        if trained(records, method) < meta["trials"]:
            short.append(f"{method} trained {trained(records, method)} of its {meta['trials']} trials: after "
                         f"{c.get('refused', 0)} refusals no more were asked.")
    md += [""] + short + ([""] if short else [])
    why = [r for r in records if r["state"] in ("failed", "diverged", "refused")]
    if why:
        md += ["Trials that did not complete:", ""]
        md += [f"- {r['method']} #{r['number']} ({settings_text(r)}): {r['state']}: {r['reason']}" for r in why]
        md.append("")
    return md
