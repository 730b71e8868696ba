"""A run trained: continued from its newest complete checkpoint, fairseq-train's whole output appended to train.log
(by the trainer itself: a pipe the user closes, ``| head``, loses nothing and does not stop the run), one line per log
interval and validation on the terminal (launch/progress.py), ``done`` written once it ended well, then its best dev
score (engine/write.run_line)."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

from recadam_fairseq.launch import prelaunch

from .spec import RunSpec, Stop

INTERRUPTED = 130  # a run Ctrl-C ended (the shell's status for SIGINT): not done, not failed
# the trainer's one-line refusal (fairseq-train's argparse and the plug-in's: "PROG: error: ..."), or an exception's
REFUSAL = re.compile(r"^[\w.-]+: error: ")
_ERROR = re.compile(REFUSAL.pattern + r"|^[A-Za-z_.]*(Error|Exception): ")


def wait(proc: subprocess.Popen):
    """(its exit status, whether Ctrl-C was pressed) once ``proc`` has ended. The trainer gets a Ctrl-C too (the
    terminal's process group) and ends itself; a second one stops it (SIGTERM), so the launcher never leaves it
    running unwatched. In a worker thread (a grid's or a search's runs side by side) no KeyboardInterrupt comes:
    a trainer ended by SIGINT is the interrupted one, and the main thread's second Ctrl-C stops it (launch/runs.py)."""
    interrupted = False
    while True:
        try:
            rc = proc.wait()
            return rc, interrupted or rc == -signal.SIGINT
        except KeyboardInterrupt:
            if interrupted:
                proc.terminate()
            interrupted = True


def score(spec: RunSpec) -> str:
    """The run's best dev score, where, and the file holding it; or why there is none."""
    from recadam_fairseq.engine.write import run_line

    try:
        return run_line(spec.run_dir, spec.end_metric)
    except Exception:  # noqa: BLE001 - a log without a validation, or none
        return "no dev score in its log"


def last_error(log: str, offset: int = 0) -> str:
    """The last error line the trainer wrote to ``log`` after byte ``offset`` (its one-line refusal, or an exception's
    last line), or ""."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            errors = [ln.rstrip("\n") for ln in f if _ERROR.match(ln)]
    except OSError:
        return ""
    return errors[-1] if errors else ""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def train(spec: RunSpec, say, env=None, out=None, err=_stderr, procs=None, session=False, stop=None) -> int:
    """Train ``spec`` in its directory (its command.sh written); the exit status (fairseq-train's when it failed, 130
    when Ctrl-C ended it). ``env``: the trainer's environment (None: this process's); ``out``: where the progress
    and end lines go (None: stdout; a grid's runs side by side prefix their name), ``err`` the failure's line;
    ``procs``: a set the trainer is in while it runs (for a second Ctrl-C's SIGTERM from the main thread);
    ``session``: the trainer in a process group of its own (a cluster job's: the job's end ends it). Whatever ends
    this call early (a cluster's requeue exits the job) ends the trainer too. ``stop`` (a threading.Event, the
    launcher's Ctrl-C): set, no trainer starts (130), and one that started as it was set is sent SIGINT."""
    from recadam_fairseq.launch import progress  # (it loads the engine: not at the scripts' start)

    out = out or progress.echo
    log = os.path.join(spec.run_dir, "train.log")
    if spec.has_checkpoints():
        msg = prelaunch.resume(spec.run_dir)
        say(msg)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.path.basename(spec.script)}: {msg}\n")
    if stop is not None and stop.is_set():  # (Ctrl-C while it was resumed: reading a checkpoint takes a while)
        return INTERRUPTED
    with open(log, "a", encoding="utf-8") as f:
        offset = f.tell()
        try:
            proc = subprocess.Popen(spec.argv, stdout=f, stderr=subprocess.STDOUT, cwd=spec.cwd, env=env,
                                    start_new_session=session)
        except OSError as e:  # as the shell says it: no such command, or not one it can run
            raise Stop(f"cannot run {spec.argv[0]} ({e.strerror}): set FAIRSEQ_TRAIN") from None
        if procs is not None:
            procs.add(proc)
        if stop is not None and stop.is_set():  # Ctrl-C came as it started: the launcher's SIGINT may have missed it
            proc.send_signal(signal.SIGINT)
        ended = threading.Event()
        follower = threading.Thread(target=progress.follow, args=(log, offset, spec.metric, ended.is_set, 0.1, out),
                                    daemon=True)
        follower.start()
        try:
            rc, interrupted = wait(proc)
        finally:
            if proc.poll() is None:  # left early (an exception): the trainer goes too, never unwatched
                os.killpg(proc.pid, signal.SIGTERM) if session else proc.terminate()
                proc.wait()
            if procs is not None:
                procs.discard(proc)
            ended.set()
            follower.join()
    if interrupted or (rc != 0 and stop is not None and stop.is_set()):  # (a second Ctrl-C's SIGTERM too)
        return INTERRUPTED
    if rc != 0:
        rc = 128 - rc if rc < 0 else rc  # killed by a signal: the shell's status
        error = last_error(log, offset)
        err(f"{os.path.basename(spec.script)}: error: fairseq-train failed (exit {rc}){': ' + error if error else ''}; "
            f"see {log}")
        return rc
    with open(os.path.join(spec.run_dir, "done"), "w") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")
    out(f"== done: {spec.run_dir} ({score(spec)})")
    if spec.after:
        out(spec.after)
    return 0
