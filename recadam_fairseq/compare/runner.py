"""One run of one setting and seed: its fairseq-train command (launch/comparison.py's), the run, measure.py on its
checkpoints, and the reuse of a finished run (in WORK or in RESULTS.json); every planned run, --jobs at a time."""

import functools
import os
import shlex
import subprocess
import sys
import time

from recadam_fairseq.compare import measure
from recadam_fairseq.compare.files import ROOT, SCRIPTS, USER_DIR, read_json, rel, write_json
from recadam_fairseq.compare.plan import cost, early_points, planned_runs
from recadam_fairseq.engine import methods
from recadam_fairseq.engine.execute import RunError, execute
from recadam_fairseq.engine.fairseq_log import read_log
from recadam_fairseq.engine.settings import fmt
from recadam_fairseq.launch import comparison


def fairseq_train():
    """The console script a user types (``fairseq-train``), from this interpreter's environment."""
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
    return [exe] if os.path.isfile(exe) else [sys.executable, "-m", "fairseq_cli.train"]


def shared(ctx):
    """What every run of the comparison shares, as launch/comparison.py builds its commands (paths as they name
    them)."""
    def path(p):
        return p and rel(p)
    return comparison.Shared(
        user_dir=rel(USER_DIR), pretrained=rel(ctx.pretrained), arch=ctx.arch, num_layers=ctx.num_layers,
        target=path(ctx.sentiment), glue=path(ctx.glue), num_classes=ctx.num_classes, mt_task=ctx.mt_task,
        multitask=ctx.multitask, lr=ctx.opts.lr, updates=ctx.opts.updates, warmup=ctx.opts.warmup,
        batch_size=ctx.opts.batch_size, log_interval=ctx.opts.log_interval, cpu=ctx.opts.device == "cpu",
        fisher=path(ctx.fisher))


def train_command(ctx, setting, seed, save_dir):
    """The fairseq-train arguments of one run (launch/comparison.py's), its intermediate points saved."""
    return comparison.train_argv(shared(ctx), setting, seed, rel(save_dir),
                                 ctx.opts.early_every if early_points(ctx.opts, setting) else None)


def measure_command(ctx, data, checkpoints, out, alphas=()):
    """measure.py's command; with ``alphas``, it also measures the last checkpoint's interpolations with θ*."""
    targets = [f"{t}={rel(d)}" for t, d in ctx.targets.items()] if ctx.targets else [rel(ctx.sentiment)]
    return [sys.executable, rel(os.path.join(SCRIPTS, "measure.py")), *map(rel, checkpoints), "--data", rel(data),
            "--target", *targets, "--snli", rel(ctx.snli), "--pretrained", rel(ctx.pretrained),
            "--threads", "1", *(["--interpolate", *map(fmt, alphas)] if alphas else []), "--out", rel(out)]


def measure_points(ctx, data, points, run_dir, env, what):
    """({updates: measures}, the command) of the checkpoints ``points`` ({updates: path}), the last one's
    interpolations at --interpolate's α under ``interpolated``."""
    mcmd = measure_command(ctx, data, [points[u] for u in sorted(points)], os.path.join(run_dir, "measured.json"),
                           ctx.opts.interpolate)
    proc = subprocess.run(mcmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RunError(f"measuring {what} failed: {' '.join(mcmd)}\n{proc.stdout[-3000:]}")
    measured = {m["updates"]: m for m in read_json(os.path.join(run_dir, "measured.json"))}
    if sorted(measured) != sorted(points):
        raise RunError(f"{run_dir}: measured updates {sorted(measured)}, expected {sorted(points)}")
    if recorded_alphas(measured[ctx.opts.updates]) != ctx.opts.interpolate:
        raise RunError(f"{run_dir}: measured interpolations at α {recorded_alphas(measured[ctx.opts.updates])}, "
                       f"expected {ctx.opts.interpolate}")
    return measured, mcmd


def recorded_alphas(run):
    """The α of the interpolations a recorded run was measured at ([] for none)."""
    return [p["alpha"] for p in run.get("interpolated", [])]


def say_interpolated(say, name, seed, res):
    for p in res.get("interpolated", []):
        say(f"   {name} seed {seed} interpolated with θ*, α {fmt(p['alpha'])}: acc {p['target_accuracy']:.4f}  "
            f"SNLI AUC {p['snli_auc']:.4f}  ‖θ−θ*‖ {p['dist']:.3f}")


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


def reinterpolate(ctx, setting, old, cmd, run_dir, say, env):
    """A finished run whose interpolations were measured at other α: its measured checkpoints, when
    --keep-checkpoints kept them, are measured again with --interpolate's α (no training); with no α
    the interpolations are dropped. None when the checkpoints are gone (the run is then repeated)."""
    name, seed = old["name"], old["seed"]
    res = {k: v for k, v in old.items() if k != "interpolated"}
    alphas = " ".join(map(fmt, ctx.opts.interpolate))
    if not ctx.opts.interpolate:
        say(f"== {name} seed {seed}: done before (its interpolations dropped: --interpolate has no α)")
        res["measure_command"] = _without_interpolate(old["measure_command"])
    else:
        try:
            points = collect(run_dir, ctx.opts.updates, early_points(ctx.opts, setting)) if os.path.isdir(run_dir) else None
        except RunError:
            points = None
        if not points:
            say(f"== {name} seed {seed}: interpolations at α {alphas} not measured and its checkpoints are gone "
                f"(--keep-checkpoints keeps them): running again")
            return None
        say(f"== {name} seed {seed}: done before; measuring it again with its interpolations at α {alphas}")
        t = time.time()
        measured, mcmd = measure_points(ctx, os.path.join(ROOT, cmd[0]), points, run_dir, env,
                                        f"{name} seed {seed}")
        res.update(measure_command=mcmd[1:], measure_seconds=round(old["measure_seconds"] + time.time() - t, 1),
                   interpolated=measured[ctx.opts.updates]["interpolated"])
        say_interpolated(say, name, seed, res)
    os.makedirs(run_dir, exist_ok=True)
    write_json(os.path.join(run_dir, "result.json"), res)
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


def run_one(ctx, setting, seed, say):
    """The result of (setting, seed): recorded before, measured again at other α, or trained and measured now;
    None for one not run yet under --report-only."""
    name = methods.setting_name(setting)
    run_dir = os.path.join(ctx.runs_dir, name, f"seed{seed}")
    cmd = train_command(ctx, setting, seed, run_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(ctx.opts.threads), MKL_NUM_THREADS=str(ctx.opts.threads))
    done, trained = find_recorded(ctx, name, seed, cmd, run_dir, say)
    if done or ctx.opts.report_only:
        if not done:
            say(f"== {name} seed {seed}: not run yet (--report-only)")
        return done
    if trained and (res := reinterpolate(ctx, setting, trained, cmd, run_dir, say, env)):
        return res
    train_s = train(name, seed, cmd, run_dir, env, say)
    return measure_run(ctx, setting, seed, cmd, run_dir, env, train_s, say)


def find_recorded(ctx, name, seed, cmd, run_dir, say):
    """(the recorded run that is this one, None) or (None, a recorded run of the same training measured at
    other α, or None). Done before: the same fairseq-train command on the same data, in WORK or in
    RESULTS.json; interpolations at other α are measured again (--report-only shows what was measured)."""
    trained = None
    done = os.path.join(run_dir, "result.json")
    for old, where in ((read_json(done), done), (ctx.prior.get((name, seed)), ctx.opts.results + ".json")):
        if old and same_command(old.get("command"), ["fairseq-train"] + cmd) and old.get("data") == ctx.data_key:
            if recorded_alphas(old) == ctx.opts.interpolate or ctx.opts.report_only:
                say(f"== {name} seed {seed}: done before ({where})" + (
                    "" if recorded_alphas(old) == ctx.opts.interpolate else
                    f"; interpolations measured at α {' '.join(map(fmt, recorded_alphas(old))) or '(none)'}"))
                return old, None
            trained = trained or old
    return None, trained


def train(name, seed, cmd, run_dir, env, say):
    """fairseq-train in ``run_dir`` (its checkpoints and results of before removed), logged to train.log;
    the seconds it took."""
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
    if proc.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        raise RunError(f"fairseq-train failed ({proc.returncode}) for {name} seed {seed}; {log}:\n{tail}")
    return time.time() - t


def logged_figures(log):
    """What fairseq logged last: the held-out accuracy of its validation, RecAdam's distance and λ."""
    logs = read_log(log)
    valid = [r for r in logs.get("valid", []) if any(k.endswith("accuracy") for k in r)]
    inner = [r for r in logs.get("train_inner", []) if "recadam_dist" in r]
    return {"fairseq_valid_accuracy": (float(next(v for k, v in valid[-1].items() if k.endswith("accuracy"))) / 100
                                       if valid else None),
            "logged_recadam_dist": float(inner[-1]["recadam_dist"]) if inner else None,
            "logged_recadam_lambda": float(inner[-1]["recadam_lambda"]) if inner and "recadam_lambda" in inner[-1]
            else None}  # (fairseq's adam logs the distance through the plug-in's criterion, without λ)


def measure_run(ctx, setting, seed, cmd, run_dir, env, train_s, say):
    """The trained run's result (written to result.json): its checkpoints measured, then removed unless
    --keep-checkpoints."""
    name = methods.setting_name(setting)
    wanted = early_points(ctx.opts, setting)
    points = collect(run_dir, ctx.opts.updates, wanted)
    data = os.path.join(ROOT, cmd[0])
    t = time.time()
    measured, mcmd = measure_points(ctx, data, points, run_dir, env, f"{name} seed {seed}")
    res = dict(setting, name=name, label=methods.label(setting), seed=seed, train_seconds=round(train_s, 1))
    res.update({k: v for k, v in measured[ctx.opts.updates].items() if k not in ("checkpoint", "updates", "interpolated")})
    res.update(logged_figures(os.path.join(run_dir, "train.log")))
    res["early"] = [{k: v for k, v in measured[u].items() if k != "checkpoint"} for u in wanted]
    for e in res["early"]:
        say(f"   {name} seed {seed} after {e['updates']} updates: acc {e['target_accuracy']:.4f}  "
            f"SNLI AUC {e['snli_auc']:.4f}")
    res.update(command=["fairseq-train"] + cmd, measure_command=mcmd[1:], data=ctx.data_key, device=ctx.opts.device,
               measure_seconds=round(time.time() - t, 1))
    if ctx.opts.interpolate:  # a run without interpolation is recorded as before
        res["interpolated"] = measured[ctx.opts.updates]["interpolated"]
        say_interpolated(say, name, seed, res)
    for f in os.listdir(run_dir):  # checkpoint_best.pt and epoch checkpoints are copies or unmeasured
        path = os.path.join(run_dir, f)
        if f.startswith("checkpoint") and (path not in points.values() or not ctx.opts.keep_checkpoints):
            os.remove(path)
    write_json(os.path.join(run_dir, "result.json"), res)
    say(f"   {name} seed {seed}: acc {res['target_accuracy']:.4f}  SNLI AUC {res['snli_auc']:.4f}  "
        f"‖θ−θ*‖ {res['dist']:.3f}  ({train_s:.0f} s training)")
    return res


def run_all(ctx, grid, on_done=None):
    """Every (setting, seed) through the engine's executor, --jobs at a time, seed by seed and the costliest first;
    results in grid order. ``on_done(results so far, planned)`` after each run."""
    todo = planned_runs(ctx.opts, grid)
    order = sorted(range(len(todo)), key=lambda i: (todo[i][1] not in ctx.opts.seeds, todo[i][1],
                                                    -cost(todo[i][0]["method"])))
    results = [None] * len(todo)

    def done(i, res, say):
        results[i] = res
        if on_done:
            on_done([r for r in results if r is not None], len(todo))

    execute([functools.partial(run_one, ctx, *t) for t in todo], ctx.opts.jobs, order, done)
    return results
