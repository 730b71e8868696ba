"""A task's results as the reader gets them: the table (between the forgetting markers of RESULTS.md and
--readme), RESULTS.json with every run, and the plot; rewritten after each finished run."""

import os

import numpy as np

from recadam_fairseq.compare import plan
from recadam_fairseq.compare.files import write_json
from recadam_fairseq.engine import methods, plot
from recadam_fairseq.engine.settings import fmt
from recadam_fairseq.engine.stats import beats_adam, compute_seconds, mean_std_text, summarize, wise_beats_adam
from recadam_fairseq.tools import readme_block

# the table goes between these lines of RESULTS.md (and of --readme): the rest of the file is kept
README_START, README_END = "<!-- forgetting:start -->", "<!-- forgetting:end -->"


def report(opts, runs, total, base, conversion, info, command, wall, final):
    """The table (between the markers of .md), every run (.json) and the plot (.png); rewritten after
    each finished run so that what is done is kept (a later call reuses the .json's runs whose commands
    match)."""
    done = sorted(runs, key=lambda r: (opts.seeds.index(r["seed"]) if r["seed"] in opts.seeds else 99))
    order = {methods.setting_name(s): i for i, s in enumerate(plan.make_grid(opts.methods, opts.gamma))}
    rows = summarize(sorted(done, key=lambda r: order.get(r["name"], 1e9)), base)
    md = markdown(rows, base, conversion, info, command, done, opts)
    if len(done) < total:
        md = f"**Partial: {len(done)} of {total} runs finished.**\n\n" + md
    os.makedirs(os.path.dirname(os.path.abspath(opts.results)), exist_ok=True)
    result = {"pretrained": base, "conversion": conversion, "data": info, "rows": rows, "runs": done,
              "complete": len(done) == total, "command": command,
              "settings": {k: getattr(opts, k) for k in ("lr", "updates", "warmup", "batch_size", "threads", "jobs",
                                                         "early_every", "seeds", "methods", "interpolate",
                                                         "third_seed")},
              "compute_seconds": round(compute_seconds(done), 1)}
    if final:
        result["wall_seconds"] = round(wall, 1)
    write_json(opts.results + ".json", result)
    write_table(opts.results + ".md", md, "--results")
    plot.plot(rows, base, opts.results + ".png", opts.updates)
    if opts.readme:
        write_table(opts.readme, md, "--readme")
    return result, md


def rounding_bound(x):
    """The power of ten above a rounding-level figure: the same on every CPU, so a report redrawn on
    another machine is byte-identical."""
    return 10.0 ** np.ceil(np.log10(max(x, 1e-30)))


def delta_auc(p) -> float:
    """The page's ΔAUC of a point: the SNLI AUC's change since θ*, minus its forgetting (negative = forgot)."""
    return 0.0 - p["forgetting"]


def markdown(rows, base, conversion, info, command, runs, opts):
    def pm(row, key, digits):
        mean = delta_auc(row) if key == "forgetting" else row[key]
        return mean_std_text(mean, row[key + "_std"], len(row["seeds"]), f".{digits}f")

    wise = any(r.get("interpolated") for r in rows)  # the column only when some run was interpolated
    lines = [
        "| method | setting | target acc (held-out) | SNLI AUC | ΔAUC (forgetting) | ‖θ−θ*‖₂ | s / run | seeds | frontier |"
        + (" WiSE-FT α: acc, ΔAUC |" if wise else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if wise else ""),
        f"| pretrained (no fine-tuning) | | | {base['snli_auc']:.4f} | 0 | 0 | | | |" + (" |" if wise else ""),
    ]
    for r in rows:
        method = r["method"] + (f", stopped at {r['stopped_at']} updates" if r.get("stopped_at") else "")
        knobs = methods.knob_text(r) + (" (λ(t) only, no pull)" if r.get("gamma") == 0 else "")
        secs = "" if r.get("stopped_at") else f"{r['train_seconds']:.0f}"
        mark = "" if r.get("stopped_at") else ("**all**" if r["frontier"] else ("method" if r["method_frontier"] else ""))
        per = (" (" + ", ".join(f"{t} {a:.3f}" for t, a in r["task_accuracy"].items()) + ")"
               if r.get("task_accuracy") else "")
        lines.append(f"| {method} | {knobs} | {pm(r, 'target_accuracy', 4)}{per} | {pm(r, 'snli_auc', 4)} | "
                     f"{pm(r, 'forgetting', 4)} | {pm(r, 'dist', 2)} | {secs} | {len(r['seeds'])} | {mark} |"
                     + (f" {wise_cell(r)} |" if wise else ""))
    adam, better = beats_adam(rows)
    sp = info["snli"]
    seeds = sorted({r["seed"] for r in runs})
    lines += [
        "",
        f"Mean ± std over seeds {', '.join(map(str, seeds))}. Every run: {opts.updates} updates of batch "
        f"{opts.batch_size}, lr {fmt(opts.lr)} (polynomial decay to 0 after {fmt(opts.warmup * 100)}% warmup), "
        f"dropout 0.1, one thread. \"stopped at\": intermediate checkpoints of the same runs (lr not yet "
        f"decayed). Frontier: **all** = no setting of any method has higher accuracy and less forgetting; "
        f"method = the same within its method. s / run: wall seconds of fine-tuning (two runs at a time on "
        f"{os.cpu_count()} cores)."
        + (" WiSE-FT: each run's final checkpoint mixed with the pretrained weights, (1 − α)·θ* + α·θ, its "
           "classification head (and any module θ* lacks) kept (scripts/interpolate.py), measured as the runs are; "
           "the column lists α: target accuracy, ΔAUC (means over seeds); α = 1 is the row itself. No training: one "
           "pass over the weights and one measurement per α. Not part of the frontier." if wise else ""),
        "",
        ("Forget less than Adam at Adam's accuracy or above (means): " + (
            ", ".join(f"{r['label']} ({r['target_accuracy']:.4f}, ΔAUC {delta_auc(r):+.4f})" for r in better)
            or "none") + f"; Adam: {adam['target_accuracy']:.4f}, ΔAUC {delta_auc(adam):+.4f}."
         + (" Of the interpolations: " + (", ".join(
             f"{r['label']} at α {fmt(p['alpha'])} ({p['target_accuracy']:.4f}, ΔAUC {delta_auc(p):+.4f})"
             for r, p in wise_beats_adam(rows, adam)) or "none") + "." if wise else "")) if adam else "",
        "",
        f"Target: {target_text(info)}. Forgetting probe: {sp['pairs']} SNLI test pairs ({sp['entailment']} "
        f"entailment, {sp['contradiction']} contradiction), ROC-AUC of cos(mean-pooled premise, hypothesis); "
        f"the original weights through a plain BERT forward give {base['snli_auc_bert_reference']:.4f}. "
        f"Conversion check: hidden states within {conversion['abs']:.2g} (max abs; ‖Δ‖/‖h‖ ≤ "
        f"{conversion['rel']:.2g}) of BERT's, within {rounding_bound(conversion['abs_same_eps']):.0e} with BERT's "
        f"LayerNorm eps set to fairseq's 1e-5 (float32 rounding, whose exact size varies with the CPU).",
        "",
        f"Command: `{command}`. Time: {compute_seconds(runs) / 3600:.1f} h of fine-tuning and measuring for the "
        f"{len(runs)} runs (one thread each).",
    ]
    return "\n".join(lines) + "\n"


def target_text(info):
    """The data line's target part, from data.json."""
    if "tasks" in info:  # the multi-task setting
        return "all at once, uniform task sampling: " + "; ".join(
            f"**{t}**: {target_text(i)}" for t, i in info["tasks"].items())
    if "snippets" in info:  # the movie task
        sn = info["snippets"]
        return (f"{sn['train']} training / {sn['valid']} held-out movie-review snippets with |rating| ≥ "
                f"{sn['neutral_band']:g} (of {sn['kept']} such, {sn['total']} in all)")
    t = info["target"]
    per = lambda key: ", ".join(f"{n} {c}" for n, c in zip(t[key], t["classes"]))  # noqa: E731
    kept = (f"of {t['kept']} with |rating| ≥ {t['neutral_band']:g}, {t['total']} in all" if "kept" in t else
            f"of {t['total']} pairs; {t['no_gold_label']} without a gold label and {t['sharing_a_probe_sentence']} "
            "sharing a sentence with the SNLI test set left out")
    return (f"{info['what']}, `{info['source']}`: {t['train']} training ({per('train_per_class')}) / "
            f"{t['valid']} held-out ({per('valid_per_class')}) {kept}")


def wise_cell(row):
    """The table's WiSE-FT cell: ``α: accuracy, ΔAUC`` per α (means over seeds)."""
    return " · ".join(f"{fmt(p['alpha'])}: {p['target_accuracy']:.3f}, {delta_auc(p):+.3f}"
                      for p in row.get("interpolated", []))


def table_target_error(path, flag):
    """Why the table cannot go into ``path`` (an existing file without the markers), or None."""
    if not os.path.exists(path):
        return None
    err = readme_block.marker_problem(path, README_START, README_END, flag)
    return err and err + " (the table goes between them; add them where it belongs, or move the file away)"


def write_table(path, md, flag):
    """The table between the forgetting markers of ``path``, the rest of the file byte for byte;
    a missing file is created holding the markers and the table."""
    if os.path.exists(path):
        readme_block.replace_block(path, README_START, README_END, md.rstrip("\n"), flag=flag)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = md.rstrip("\n")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(f"{README_START}\n{text}\n{README_END}\n")
    os.replace(path + ".tmp", path)
