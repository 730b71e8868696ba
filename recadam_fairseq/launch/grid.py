"""scripts/glue/grid.sh's plan and its runs: every (seed, method[, k, t0]) of the environment's SEEDS, METHODS, KS and
T0S, each a ``finetune.sh TASK METHOD`` run; ``JOBS`` of them at a time (engine/execute.py), each with GPUs of
its own where there are GPUs (NUM_GPUS of them, from CUDA_VISIBLE_DEVICES's list or nvidia-smi's).

    scripts/glue/grid.sh TASK [extra fairseq-train args...]

Before training anything, every run is built here as finetune.sh builds it (recadam_fairseq/launch: its directory
and command), and each directory started with another command is refused in finetune.sh's words: nothing trains
then (exit 2). A finished run is skipped, an unfinished one resumes (RESTART=1 starts every run over); a failed run
does not stop the others, the failures are listed at the end (exit 1). With JOBS > 1 each run's lines carry its name
and a line after each run says how many are done, running and left.

CLUSTER=slurm sends each run as a SLURM job through submitit (PARTITION, TIME_MIN [240] a job, NUM_GPUS GPUs and
CPUS_PER_RUN [8] CPUs a run; its logs in SAVE_DIR/TASK/.submitit/): a job that times out or is preempted is
requeued by submitit and the run resumes from its own checkpoints, as finetune.sh resumes an unfinished run.
CLUSTER=local runs the same jobs through submitit on this machine."""

import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Dict, List

from recadam_fairseq.engine.execute import RunError, execute
from recadam_fairseq.launch import glue
from recadam_fairseq.launch.spec import Conflict, RunSpec, Stop
from recadam_fairseq.launch.variables import Variables

SCRIPT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "scripts", "glue")
DEFAULTS = {"KS": "0.05 0.1 0.2 0.5 1", "T0S": "100 250 500 1000", "SEEDS": "1", "METHODS": "recadam"}


def plan(env: Dict[str, str]) -> List[Dict[str, str]]:
    """The grid's runs in the order they run: each the variables its finetune.sh call gets (SEED, METHOD, K, T0)."""
    from recadam_fairseq.launch.prelaunch import method_plan

    words = {k: env.get(k) or v for k, v in DEFAULTS.items()}
    recadam = {}
    for m in words["METHODS"].split():  # the catalogue's names, as finetune.sh takes them
        try:
            recadam[m] = bool(method_plan(m, env)["METHOD_RECADAM"])
        except Stop as e:
            raise Stop(f"METHODS: {e}") from None
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


def positive(env: Dict[str, str], name: str, default: int, what: str = "a positive whole number") -> int:
    """The environment's ``name``, a whole number of at least 1 (``default`` when unset); Stop naming it if not."""
    value = env.get(name) or str(default)
    if not value.isdigit() or int(value) < 1:
        raise Stop(f"{name}={value}: {what}")
    return int(value)


def resources(env: Dict[str, str], task: str) -> dict:
    """A cluster job's resources (submitit's AutoExecutor parameters) from the environment."""
    params = dict(timeout_min=positive(env, "TIME_MIN", 240), gpus_per_node=positive(env, "NUM_GPUS", 1), nodes=1,
                  tasks_per_node=1, cpus_per_task=positive(env, "CPUS_PER_RUN", 8), name=f"grid-{task}")
    if env.get("PARTITION"):
        params["slurm_partition"] = env["PARTITION"]
    if env["CLUSTER"] == "local" and not gpus(env):
        params["gpus_per_node"] = 0
    return params


def gpus(env: Dict[str, str]) -> List[str]:
    """The GPUs runs may take: CUDA_VISIBLE_DEVICES's list, else nvidia-smi's; none on a CPU machine."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return [str(i) for i, ln in enumerate(out.stdout.splitlines()) if ln.startswith("GPU ")] if out.returncode == 0 else []


def command(task: str, run: Dict[str, str], env: Dict[str, str], extra: List[str]):
    """(argv, environment) of finetune.sh TASK METHOD for ``run``."""
    e = {**env, **{k: v for k, v in run.items() if k != "METHOD"}}
    return ["bash", os.path.join(SCRIPT_DIR, "finetune.sh"), task, run["METHOD"], *extra], e


def spec(task: str, run: Dict[str, str], env: Dict[str, str], extra: List[str], cuda=None) -> RunSpec:
    """The run finetune.sh makes of ``run``, built here (its notes are the run's to say when it trains); ``cuda``:
    whether the machine that trains it has CUDA (None: this one)."""
    _, e = command(task, run, env, extra)
    return glue.build(Variables(e, "finetune.sh", say=lambda msg: None, cuda=cuda), task, run["METHOD"], extra)


def finetune(task, run, env, extra) -> int:
    """finetune.sh for ``run``, its lines as they come; its exit status (a Ctrl-C waits for it to end)."""
    from recadam_fairseq.launch.train import wait

    argv, e = command(task, run, env, extra)
    rc, interrupted = wait(subprocess.Popen(argv, env=e))
    if interrupted:
        raise KeyboardInterrupt
    return rc


def run_name(d: str) -> str:
    """METHOD/seedN of a run directory SAVE_DIR/TASK/METHOD/seedN."""
    return os.path.relpath(d, os.path.dirname(os.path.dirname(d)))


class FinetuneJob:
    """One run as a submitit job: its finetune.sh command. On a timeout or a preemption submitit calls
    ``checkpoint`` and requeues the same command, which resumes from the run's newest checkpoint."""

    def __init__(self, argv: List[str], env: Dict[str, str]):
        # the scheduler's own variables are the job's, not the login node's
        self.argv, self.env = argv, {k: v for k, v in env.items()
                                     if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}

    def __call__(self) -> int:
        # its own process group: a requeue (submitit's exit from its signal handler) stops the trainer too
        proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, start_new_session=True)
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
        if rc != 0:
            raise RuntimeError(f"finetune.sh exited with {rc}")
        return rc

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self)  # the same command again: finetune.sh resumes


def on_cluster(task, todo, env, extra, skipped, params: dict) -> int:
    """The runs as submitit jobs (one array, ``params``: :func:`resources`), waited for: a line as each ends, the
    failures at the end."""
    import time

    import submitit

    failed = []
    if todo:
        folder = os.path.join(os.path.dirname(os.path.dirname(todo[0][1])), ".submitit")
        ex = submitit.AutoExecutor(folder=folder, cluster=env["CLUSTER"])
        ex.update_parameters(**params)
        with ex.batch():
            jobs = [ex.submit(FinetuneJob(*command(task, run, env, extra))) for run, _ in todo]
        print(f"grid.sh: {task}: {len(jobs)} runs sent to {env['CLUSTER']} (job {jobs[0].job_id.split('_')[0]}); "
              f"their logs: {folder}", flush=True)
        waiting = dict(enumerate(jobs))
        while waiting:
            for i, job in list(waiting.items()):
                if not job.done():
                    continue
                del waiting[i]
                d, state = todo[i][1], "done"
                try:
                    job.result()
                except Exception:  # noqa: BLE001 - the job's own log has why
                    failed.append(d)
                    state = "failed"
                    print(f"grid.sh: run failed: {d} (its log: {job.paths.stderr})", file=sys.stderr, flush=True)
                print(f"grid.sh: {task}: {run_name(d)} {state}; "
                      f"{len(jobs) - len(waiting)} of {len(jobs)} ended", flush=True)
            if waiting:
                time.sleep(float(env.get("GRID_POLL_S") or 10))
    print(f"grid.sh: {task}: ran {len(todo)}, skipped {skipped}, failed {len(failed)}", flush=True)
    if failed:
        print("".join(f"  failed: {d}\n" for d in failed), end="", file=sys.stderr)
        return 1
    return 0


def main(argv: List[str]) -> int:
    if not argv:
        print("grid.sh: error: expected TASK", file=sys.stderr)
        return 2
    task, extra = argv[0], argv[1:]
    env = dict(os.environ)
    restart = env.get("RESTART", "0") == "1"
    try:  # every variable checked, every run built, before any is trained
        runs, jobs = plan(env), positive(env, "JOBS", 1, "the number of runs at a time, 1 or more")
        n_gpus = positive(env, "NUM_GPUS", 1)
        if env.get("CLUSTER") not in (None, "", "slurm", "local"):
            raise Stop(f"CLUSTER={env['CLUSTER']}: slurm (SLURM jobs through submitit) or local (the same, on this "
                       f"machine)")
        params = resources(env, task) if env.get("CLUSTER") else None
        # a SLURM job's machine has the GPUs it asks for, whatever this one has (FP16 auto: fp16 there)
        cuda = bool(params["gpus_per_node"]) if env.get("CLUSTER") == "slurm" else None
        specs = [spec(task, run, env, extra, cuda) for run in runs]
    except Stop as e:
        for line in str(e).splitlines():
            print(f"grid.sh: error: {line}", file=sys.stderr)
        return 2

    todo, conflicts = [], 0
    for run, s in zip(runs, specs):
        try:
            state = s.state(restart)
        except Conflict as e:
            print(f"grid.sh: error: {e}", file=sys.stderr, flush=True)
            conflicts += 1
            continue
        if state == "done":
            print(f"skip {s.run_dir} (done)", flush=True)
        else:
            todo.append((run, s.run_dir))
    if conflicts:
        print(f"grid.sh: {task}: nothing trained", file=sys.stderr)
        return 2
    if params is not None:
        return on_cluster(task, todo, env, extra, len(runs) - len(todo), params)
    devices = gpus(env) if jobs > 1 else []
    groups = [devices[i:i + n_gpus] for i in range(0, len(devices) - n_gpus + 1, n_gpus)]  # NUM_GPUS of them a run
    free = list(range(jobs))  # the slots a run takes (its GPUs: groups[slot % len(groups)])
    lock = threading.Lock()
    ended = [0]

    def one(run, d):
        def go(say):
            with lock:
                slot = free.pop(0)
            if os.path.exists(os.path.join(d, "train.log")) and not restart:
                say(f"resume {d} (unfinished)")
            e = dict(env)
            if groups:
                e["CUDA_VISIBLE_DEVICES"] = ",".join(groups[slot % len(groups)])
            try:
                if jobs == 1:  # the run's own lines, as they come
                    ok = finetune(task, run, e, extra) == 0
                else:  # side by side: each line with the run's name
                    name = run_name(d)
                    argv, e = command(task, run, e, extra)
                    proc = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            bufsize=1)
                    for line in proc.stdout:
                        say(f"[{name}] {line.rstrip()}")
                    ok = proc.wait() == 0
            finally:
                with lock:
                    free.append(slot)
                    ended[0] += 1
                    done, running = ended[0], jobs - len(free)
                if jobs > 1:
                    say(f"grid.sh: {task}: {done} of {len(todo)} ended, {running} running, "
                        f"{len(todo) - done - running} left")
            if not ok:
                say(f"grid.sh: run failed: {d}")
                raise RunError(d)

        return go

    failed = []
    try:
        execute([one(run, d) for run, d in todo], jobs=jobs)
    except RunError as e:
        failed = str(e).split("\n\n")
    print(f"grid.sh: {task}: ran {len(todo)}, skipped {len(runs) - len(todo)}, failed {len(failed)}", flush=True)
    if failed:
        print("".join(f"  failed: {d}\n" for d in failed), end="", file=sys.stderr)
        return 1
    return 0
