"""Runs side by side, for grid.sh and tune.sh: RunSpecs trained ``JOBS`` at a time on this machine (engine/execute.py),
each with GPUs of its own where there are GPUs (``NUM_GPUS`` a run, from CUDA_VISIBLE_DEVICES's list or nvidia-smi's),
or sent as cluster jobs through submitit (``CLUSTER=slurm|local``), each job carrying its spec (:class:`SpecJob`).

Ctrl-C: no other run starts, the ones under way end (their trainers get it from the terminal, and from the launcher
half a second later if they still run: a launcher signalled alone, ``kill -INT``, is not in their process group) and
are waited for; an interrupted run is neither a failure nor done (the same command resumes it). A second Ctrl-C stops
the trainers (SIGTERM). A cluster's jobs go on without the launcher; the same command waits for them again."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from .spec import RunSpec, Stop
from .train import INTERRUPTED
from .variables import Variables

NODE_OWN = ("CUDA_VISIBLE_DEVICES", "TMPDIR", "TMP", "TEMP", "HOSTNAME")  # a cluster node's, not the login node's


def gpu_list(env: Dict[str, str]) -> List[str]:
    """The GPUs runs may take: CUDA_VISIBLE_DEVICES's list, else nvidia-smi's; none on a CPU machine."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return [str(i) for i, ln in enumerate(out.stdout.splitlines()) if ln.startswith("GPU ")] if out.returncode == 0 else []


def gpu_groups(devices: List[str], jobs: int, n_gpus: int) -> List[List[str]]:
    """NUM_GPUS GPUs for each of JOBS runs, none shared: [] on a machine without GPUs (or one run at a time, which
    sees them all); Stop when they are not enough."""
    if not devices:
        return []
    if n_gpus > len(devices):
        raise Stop(f"NUM_GPUS={n_gpus}: a run's GPUs, but this machine has {len(devices)} "
                   f"({','.join(devices)}): NUM_GPUS={len(devices)} or fewer")
    if jobs == 1:
        return []
    if jobs * n_gpus > len(devices):
        raise Stop(f"JOBS={jobs} runs of NUM_GPUS={n_gpus} GPU{'s' if n_gpus > 1 else ''} need {jobs * n_gpus} GPUs, "
                   f"this machine has {len(devices)} ({','.join(devices)}): JOBS={len(devices) // n_gpus} or fewer")
    return [devices[i * n_gpus:(i + 1) * n_gpus] for i in range(jobs)]


def cluster_params(v: Variables, name: str) -> Optional[dict]:
    """A cluster job's resources (submitit's AutoExecutor parameters) from CLUSTER, PARTITION, TIME_MIN [240],
    NUM_GPUS [1] and CPUS_PER_RUN [8]; None without CLUSTER."""
    cluster = v.get("CLUSTER")
    if not cluster:
        return None
    if cluster not in ("slurm", "local"):
        raise Stop(f"CLUSTER={cluster}: slurm (SLURM jobs through submitit) or local (the same, on this machine)")
    params = dict(timeout_min=v.whole("TIME_MIN", 240), gpus_per_node=v.whole("NUM_GPUS", 1), nodes=1,
                  tasks_per_node=1, cpus_per_task=v.whole("CPUS_PER_RUN", 8), name=name)
    if v.get("PARTITION"):
        params["slurm_partition"] = v.get("PARTITION")
    if cluster == "local" and not gpu_list(v.env):
        params["gpus_per_node"] = 0
    return params


class SpecJob:
    """One run as a submitit job: its RunSpec, trained on the node as the task scripts train it (launch/train.py).
    On a timeout or a preemption submitit calls ``checkpoint`` and requeues the same job, which resumes the run from
    its newest checkpoint; the first attempt's trainer ends with the job (a process group of its own)."""

    def __init__(self, spec: RunSpec, env: Dict[str, str]):
        # the scheduler's and the node's own variables are the job's, not the login node's
        self.spec, self.env = spec, {k: v for k, v in env.items()
                                     if not k.startswith("SLURM_") and k not in NODE_OWN}

    def __call__(self) -> int:
        from .train import train

        if self.spec.done():  # a requeue of a job that had ended its run
            return 0
        self.spec.write()
        say = lambda msg: print(f"{os.path.basename(self.spec.script)}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
        print(self.spec.banner, flush=True)
        rc = train(self.spec, say, env={**os.environ, **self.env}, session=True)
        if rc != 0:
            raise RuntimeError(f"fairseq-train exited with {rc}; see {os.path.join(self.spec.run_dir, 'train.log')}")
        return rc

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self)  # the same run again: it resumes


class Runs:
    """RunSpecs trained ``jobs`` at a time: locally (each with its GPU group), or as cluster jobs (``params``:
    :func:`cluster_params`, their logs in ``folder``)."""

    def __init__(self, v: Variables, jobs: int, n_gpus: int, params: Optional[dict] = None,
                 folder: Optional[str] = None):
        self.env, self.jobs, self.params, self.folder = dict(v.env), jobs, params, folder
        self.groups = [] if params else gpu_groups(gpu_list(v.env), jobs, n_gpus)
        self.free = list(range(jobs))  # the slots a run takes (its GPUs: groups[slot])
        self.lock = threading.Lock()
        self.procs: set = set()  # the trainers running here
        self.stop = threading.Event()  # Ctrl-C: no more runs, and a cluster run is no longer waited for
        self.poll = float(self.env.get("GRID_POLL_S") or 10)

    def launch(self, spec: RunSpec, v: Variables, say: Callable[[str], None], name: str, err=None) -> int:
        """One run of a grid's or a search's, its state checked by the caller, as the task scripts launch it
        (command.launch: RESTART=1, command.sh, the banner) and trained here: its exit status, 130 when Ctrl-C ended
        it (or a second Ctrl-C's SIGTERM, or came before it started)."""
        from .command import launch

        if os.path.exists(os.path.join(spec.run_dir, "train.log")) and not v.restart:
            say(f"resume {spec.run_dir} (unfinished)")
        rc = launch(spec, v, trainer=lambda sp, _: self.train(sp, say, name, err), out=self.tagged(say, name) or say)
        return INTERRUPTED if rc != 0 and self.stop.is_set() else rc

    def train(self, spec: RunSpec, say: Callable[[str], None], name: str = "", err=None) -> int:
        """Train ``spec`` here (its command.sh written, its state checked by the caller): its exit status, 130
        when Ctrl-C ended it (or came before it started). With runs side by side, each line carries ``name``;
        ``err``: where a failure's line goes (default: stderr, or the run's lines)."""
        from .train import _stderr, train

        with self.lock:
            slot = self.free.pop(0)
        env = dict(self.env)
        if self.groups:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.groups[slot])
        out = self.tagged(say, name)
        try:
            return train(spec, lambda msg: (out or say)(f"{os.path.basename(spec.script)}: {msg}"), env=env, out=out,
                         err=err or out or _stderr, procs=self.procs, stop=self.stop)
        finally:
            with self.lock:
                self.free.append(slot)

    def tagged(self, say: Callable[[str], None], name: str) -> Optional[Callable[[str], None]]:
        """``say`` with each line marked ``[name]`` when runs go side by side (which run said it), else None."""
        return (lambda text: say(f"[{name}] {text}")) if self.jobs > 1 else None

    def executor(self):
        import submitit

        ex = submitit.AutoExecutor(folder=self.folder, cluster=self.env["CLUSTER"])
        ex.update_parameters(**self.params)
        return ex

    def job(self, job_id: str):
        """A cluster job sent earlier (its id, recorded by the caller), to wait for again."""
        import submitit

        kind = submitit.SlurmJob if self.env["CLUSTER"] == "slurm" else submitit.LocalJob
        return kind(folder=self.folder, job_id=job_id)

    def wait_job(self, job) -> Optional[str]:
        """None once ``job`` ended well, else why not (its log named); "interrupted" when Ctrl-C stopped the wait
        (the job goes on)."""
        while not job.done():
            if self.stop.wait(self.poll):
                return "interrupted"
        return failure(job)

    def execute(self, plan: List[Callable]):
        """engine/execute.py's plan ``self.jobs`` at a time. Ctrl-C: no run starts after it, those under way end
        (their trainers got it too; a second Ctrl-C stops them), then KeyboardInterrupt."""
        from recadam_fairseq.engine.execute import execute

        return execute(plan, jobs=self.jobs, stop=self.stop, on_interrupt=self.terminate, on_stop=self.pass_interrupt)

    def pass_interrupt(self, grace: float = 0.5) -> None:
        """SIGINT to the trainers still running ``grace`` seconds after the launcher's Ctrl-C (in a thread)."""
        def later():
            time.sleep(grace)
            self.signal(signal.SIGINT)

        threading.Thread(target=later, daemon=True).start()

    def signal(self, sig: int) -> None:
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM to every trainer still running here."""
        self.signal(signal.SIGTERM)


def failure(job) -> Optional[str]:
    """Why a cluster job that ended did not end well (its log named), or None."""
    try:
        job.result()
    except Exception:  # noqa: BLE001 - the job's own log has why
        return f"its log: {job.paths.stderr}"
    return None


def run_name(d: str) -> str:
    """METHOD/seedN of a run directory SAVE_DIR/TASK/METHOD/seedN: the run in a grid's and a search's lines."""
    return os.path.relpath(d, os.path.dirname(os.path.dirname(d)))


def ended(script: str, task: str, ran: int, skipped: int, failed: List[str]) -> int:
    """The last lines of a grid's runs: the counts, then each failure (exit 1); 0 without."""
    print(f"{script}: {task}: ran {ran}, skipped {skipped}, failed {len(failed)}", flush=True)
    if failed:
        print("".join(f"  failed: {d}\n" for d in failed), end="", file=sys.stderr)
        return 1
    return 0


def interrupted_exit(script: str, what: str) -> int:
    """The line after Ctrl-C, and its exit status."""
    print(f"{script}: interrupted: {what}; the same command goes on from there", file=sys.stderr, flush=True)
    return INTERRUPTED


def sigterm_is_ctrl_c() -> None:
    """SIGTERM to the launcher (a cluster's kill, ``kill PID``) takes Ctrl-C's path: the trainers are sent it too and
    waited for, none left running unwatched."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
