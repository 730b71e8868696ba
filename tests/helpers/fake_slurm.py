"""A pretend SLURM cluster on this machine: stand-in ``sbatch``, ``srun``, ``sacct``, ``scancel`` and ``scontrol``
commands that a real submitit drives (grid.sh CLUSTER=slurm in tests/test_glue_scripts.py). ``sbatch FILE`` runs the
file's job (each index of its ``--array``) in the background with the SLURM_* variables a job sees, ``srun`` runs its
command with its ``--output`` / ``--error`` files, ``sacct`` reports each job's state, ``scancel JOB`` stops one and
``scancel --signal SIG JOB`` signals its task (as SLURM does before a job's time ends or when it is preempted),
``scontrol requeue JOB`` starts it again. State: one file a job under FAKE_SLURM_STATE (and JOB.task: its task's pid,
JOB.requeued: how often it was requeued)."""

import os
import re
import signal
import subprocess
import sys

STATE = os.environ.get("FAKE_SLURM_STATE", "")


def _write(name, text):
    tmp = os.path.join(STATE, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(STATE, name))


def _start(name, path, env):
    """Job ``name`` (the file ``path``) in the background, a process session of its own."""
    _write(name, "PENDING")
    subprocess.Popen([sys.executable, __file__, "run", name, path], env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sbatch(path):
    text = open(path).read()
    m = re.search(r"^#SBATCH --array=0-(\d+)", text, re.M)
    indices = range(int(m.group(1)) + 1) if m else [None]
    counter = os.path.join(STATE, "next")
    job = int(open(counter).read()) if os.path.exists(counter) else 1000
    _write("next", str(job + 1))
    for i in indices:
        name = str(job) if i is None else f"{job}_{i}"
        env = dict(os.environ, SLURM_JOB_ID=str(job if i is None else job * 100 + i), SLURM_NTASKS="1",
                   SLURM_JOB_NUM_NODES="1",
                   SLURM_NODEID="0", SLURM_JOB_NODELIST="localhost", SLURM_PROCID="0", SLURM_LOCALID="0")
        if i is not None:
            env.update(SLURM_ARRAY_JOB_ID=str(job), SLURM_ARRAY_TASK_ID=str(i))
        _write(name + ".script", os.path.abspath(path))
        _start(name, path, env)
    print(f"Submitted batch job {job}")


def run(name, path):
    me = f"RUNNING {os.getpid()}"
    _write(name, me)
    rc = subprocess.run(["bash", path]).returncode
    if open(os.path.join(STATE, name)).read() == me:  # (not requeued or cancelled meanwhile)
        _write(name, "COMPLETED" if rc == 0 else "FAILED")


def srun(args):
    files = {}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            files[flag] = args.pop(0)
    job, task_id = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ["SLURM_JOB_ID"]), os.environ.get("SLURM_ARRAY_TASK_ID", "0")
    out = {k: open(v.replace("%A", job).replace("%a", task_id).replace("%j", os.environ["SLURM_JOB_ID"])
                   .replace("%t", "0"), "a") for k, v in files.items()}
    task = subprocess.Popen(args, stdout=out.get("--output"), stderr=out.get("--error", out.get("--output")))
    name = job if "SLURM_ARRAY_TASK_ID" not in os.environ else f"{job}_{task_id}"
    _write(name + ".task", str(task.pid))
    sys.exit(task.wait())


def sacct(args):
    ids = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
    print("JobID|State|NodeList")
    for name in sorted(os.listdir(STATE)):
        if "." not in name and name.split("_")[0] in ids:
            print(f"{name}|{open(os.path.join(STATE, name)).read().split()[0]}|localhost")


def scancel(args):
    if args[0] == "--signal":  # to the job's task, as SLURM's --signal does
        os.kill(int(open(os.path.join(STATE, args[2] + ".task")).read()), getattr(signal, "SIG" + args[1]))
        return
    name = args[0]
    state = open(os.path.join(STATE, name)).read().split()
    if state[0] == "RUNNING":
        os.killpg(int(state[1]), signal.SIGTERM)
    _write(name, "CANCELLED")


def scontrol(args):
    assert args[0] == "requeue", args
    name = args[1]
    requeued = os.path.join(STATE, name + ".requeued")
    _write(name + ".requeued", str(int(open(requeued).read()) + 1 if os.path.exists(requeued) else 1))
    # called from inside the job: its own SLURM_* variables start the same job again
    _start(name, open(os.path.join(STATE, name + ".script")).read(), dict(os.environ))


def install(bin_dir, state_dir):
    """The five commands in ``bin_dir`` (put it first on PATH, FAKE_SLURM_STATE=state_dir)."""
    os.makedirs(bin_dir, exist_ok=True)
    os.makedirs(state_dir, exist_ok=True)
    for cmd in ("sbatch", "srun", "sacct", "scancel", "scontrol"):
        path = os.path.join(bin_dir, cmd)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} {cmd} \"$@\"\n")
        os.chmod(path, 0o755)


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "sbatch":
        sbatch(rest[-1])
    elif cmd == "run":
        run(*rest)
    elif cmd == "srun":
        srun(rest)
    elif cmd == "sacct":
        sacct(rest)
    elif cmd == "scancel":
        scancel(rest)
    elif cmd == "scontrol":
        scontrol(rest)
