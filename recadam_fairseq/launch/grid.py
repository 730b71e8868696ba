"""scripts/glue/grid.sh's plan and its runs: every (seed, method[, k, t0]) of the environment's SEEDS, METHODS, KS and
T0S, each a ``finetune.sh TASK METHOD`` run; ``JOBS`` of them at a time (engine/execute.py), each with GPUs of
its own where there are GPUs (NUM_GPUS of them, from CUDA_VISIBLE_DEVICES's list or nvidia-smi's).

    scripts/glue/grid.sh TASK [extra fairseq-train args...]

Before training anything, every run is built here as finetune.sh builds it (recadam_fairseq/launch: its directory
and command), and each directory started with another command is refused in finetune.sh's words: nothing trains
then (exit 2). Each run is then trained from that spec (launch/runs.py), as finetune.sh trains it: a finished run is
skipped, an unfinished one resumes (RESTART=1 starts every run over); a failed run does not stop the others, the
failures are listed at the end (exit 1). With JOBS > 1 each run's lines carry its name and a line after each run
says how many are done, running and left. Ctrl-C ends the runs under way (exit 130): the same command resumes them.

CLUSTER=slurm sends each run as a SLURM job through submitit, carrying its spec (PARTITION, TIME_MIN [240] a job,
NUM_GPUS GPUs and CPUS_PER_RUN [8] CPUs a run; its logs in SAVE_DIR/TASK/.submitit/): a job that times out or is
preempted is requeued by submitit and the run resumes from its own checkpoints, as finetune.sh resumes an
unfinished run. CLUSTER=local runs the same jobs through submitit on this machine."""

import os
import sys
import threading
import time
from typing import Dict, List

from recadam_fairseq.engine.execute import RunError
from recadam_fairseq.launch import glue
from recadam_fairseq.launch.command import say_error
from recadam_fairseq.launch.runs import (INTERRUPTED, Runs, SpecJob, cluster_params, ended, failure, interrupted_exit,
                                         run_name, sigterm_is_ctrl_c)
from recadam_fairseq.launch.spec import Conflict, RunSpec, Stop
from recadam_fairseq.launch.variables import Variables

DEFAULTS = {"KS": "0.05 0.1 0.2 0.5 1", "T0S": "100 250 500 1000", "SEEDS": "1", "METHODS": "recadam"}


def plan(env: Dict[str, str]) -> List[Dict[str, str]]:
    """The grid's runs in the order they run: each the variables its finetune.sh call gets (SEED, METHOD, K, T0)."""
    from recadam_fairseq.launch.prelaunch import methods_plans

    words = {k: env.get(k) or v for k, v in DEFAULTS.items()}
    recadam = {m: bool(p["METHOD_RECADAM"]) for m, p in methods_plans(words["METHODS"].split(), env).items()}
    if not (words["KS"].split() and words["T0S"].split() and words["SEEDS"].split()):
        raise Stop("KS, T0S and SEEDS must not be empty")
    runs = []
    for seed in words["SEEDS"].split():
        for m in words["METHODS"].split():
            if not recadam[m]:  # no RecAdam knobs: no (k, t0) grid
                runs.append({"SEED": seed, "METHOD": m})
                continue
            runs += [{"SEED": seed, "METHOD": m, "K": k, "T0": t0} for k in words["KS"].split()
                     for t0 in words["T0S"].split()]
    return runs


def variables(run: Dict[str, str], env: Dict[str, str], say=lambda msg: None, cuda=None) -> Variables:
    """finetune.sh's variables for ``run``: the grid's environment with the run's SEED, K and T0."""
    return Variables({**env, **{k: v for k, v in run.items() if k != "METHOD"}}, "finetune.sh", say=say, cuda=cuda)


def spec(task: str, run: Dict[str, str], env: Dict[str, str], extra: List[str], cuda=None) -> RunSpec:
    """The run finetune.sh makes of ``run``, built here (its notes are the run's to say when it trains); ``cuda``:
    whether the machine that trains it has CUDA (None: this one)."""
    return glue.build(variables(run, env, cuda=cuda), task, run["METHOD"], extra)


def on_cluster(task: str, todo, runs: Runs, skipped: int) -> int:
    """The runs as submitit jobs (one array, each carrying its spec), waited for: a line as each ends, the failures
    at the end. Ctrl-C stops the waiting, not the jobs."""
    failed = []
    if todo:
        ex = runs.executor()
        with ex.batch():
            jobs = [ex.submit(SpecJob(s, runs.env)) for _, s in todo]
        print(f"grid.sh: {task}: {len(jobs)} runs sent to {runs.env['CLUSTER']} (job {jobs[0].job_id.split('_')[0]}); "
              f"their logs: {runs.folder}", flush=True)
        waiting = dict(enumerate(jobs))
        try:
            while waiting:
                for i, job in list(waiting.items()):
                    if not job.done():
                        continue
                    del waiting[i]
                    d, why = todo[i][1].run_dir, failure(job)
                    if why:
                        failed.append(d)
                        print(f"grid.sh: run failed: {d} ({why})", file=sys.stderr, flush=True)
                    state = "failed" if why else "done"
                    print(f"grid.sh: {task}: {run_name(d)} {state}; "
                          f"{len(jobs) - len(waiting)} of {len(jobs)} ended", flush=True)
                if waiting:
                    time.sleep(runs.poll)
        except KeyboardInterrupt:
            return interrupted_exit("grid.sh", f"{len(waiting)} jobs still on {runs.env['CLUSTER']}, not waited for")
    return ended("grid.sh", task, len(todo), skipped, failed)


def main(argv: List[str]) -> int:
    if not argv:
        print("grid.sh: error: expected TASK", file=sys.stderr)
        return 2
    task, extra = argv[0], argv[1:]
    sigterm_is_ctrl_c()
    env = dict(os.environ)
    v = Variables(env, "grid.sh")
    try:  # every variable checked, every run built, before any is trained
        runs, jobs, n_gpus = plan(env), v.whole("JOBS", 1), v.whole("NUM_GPUS", 1)
        params = cluster_params(v, f"grid-{task}")
        # a SLURM job's machine has the GPUs it asks for, whatever this one has (FP16 auto: fp16 there)
        cuda = bool(params["gpus_per_node"]) if v.get("CLUSTER") == "slurm" else None
        specs = [spec(task, run, env, extra, cuda) for run in runs]
        folder = os.path.join(os.path.dirname(os.path.dirname(specs[0].run_dir)), ".submitit") if specs else None
        pool = Runs(v, jobs, n_gpus, params, folder)
    except Stop as e:
        say_error("grid.sh", e)
        return 2

    todo, conflicts = [], 0
    for run, s in zip(runs, specs):
        try:
            state = s.state(v.restart)
        except Conflict as e:
            print(f"grid.sh: error: {e}", file=sys.stderr, flush=True)
            conflicts += 1
            continue
        if state == "done":
            print(f"skip {s.run_dir} (done)", flush=True)
        else:
            todo.append((run, s))
    if conflicts:
        print(f"grid.sh: {task}: nothing trained", file=sys.stderr)
        return 2
    if params is not None:
        return on_cluster(task, todo, pool, len(runs) - len(todo))
    lock, count = threading.Lock(), [0]

    def one(run, s):
        def go(say):
            name = run_name(s.run_dir)
            tell = pool.tagged(say, name) or say
            try:
                rc = pool.launch(s, variables(run, env, say=lambda msg: tell(f"finetune.sh: {msg}")), say, name)
            finally:
                with lock:  # (said under the lock: the counts in order)
                    count[0] += 1
                    done, running = count[0], jobs - len(pool.free)
                    if jobs > 1:
                        say(f"grid.sh: {task}: {done} of {len(todo)} ended, {running} running, "
                            f"{len(todo) - done - running} left")
            if rc == INTERRUPTED:  # no other run starts
                pool.stop.set()
                return rc
            if rc != 0:
                say(f"grid.sh: run failed: {s.run_dir}")
                raise RunError(s.run_dir)
            return rc

        return go

    failed = []
    try:
        pool.execute([one(run, s) for run, s in todo])
    except RunError as e:
        failed = str(e).split("\n\n")
    except KeyboardInterrupt:
        return interrupted_exit("grid.sh", "the runs under way ended")
    if pool.stop.is_set():  # (a run's trainer was interrupted, the Ctrl-C not seen here)
        return interrupted_exit("grid.sh", "the runs under way ended")
    return ended("grid.sh", task, len(todo), len(runs) - len(todo), failed)
