"""A run trained: continued from its newest complete checkpoint, fairseq-train's whole output appended to train.log
(by the trainer itself: a pipe the user closes, ``| head``, loses nothing and does not stop the run), one line per log
interval and validation on the terminal (tools/progress.py), ``done`` written once it ended well, then its best dev
score (engine/write.run_line)."""

import os
import re
import subprocess
import sys
import threading
import time

from recadam_fairseq.launch import prelaunch

from .spec import RunSpec, Stop

_ERROR = re.compile(r"^(fairseq-train: error: |[A-Za-z_.]*(Error|Exception): )")


def wait(proc: subprocess.Popen):
    """(its exit status, whether Ctrl-C was pressed) once ``proc`` has ended. The trainer gets a Ctrl-C too (the
    terminal's process group) and ends itself; a second one stops it (SIGTERM), so the launcher never leaves it
    running unwatched."""
    interrupted = False
    while True:
        try:
            return proc.wait(), interrupted
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


def train(spec: RunSpec, say) -> int:
    """Train ``spec`` in its directory (its command.sh written); the exit status (fairseq-train's when it failed)."""
    from recadam_fairseq.tools import progress  # (it loads the engine: not at the scripts' start)

    log = os.path.join(spec.run_dir, "train.log")
    if spec.has_checkpoints():
        msg = prelaunch.resume(spec.run_dir)
        say(msg)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.path.basename(spec.script)}: {msg}\n")
    with open(log, "a", encoding="utf-8") as out:
        offset = out.tell()
        try:
            proc = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT, cwd=spec.cwd)
        except OSError as e:  # as the shell says it: no such command, or not one it can run
            raise Stop(f"cannot run {spec.argv[0]} ({e.strerror}): set FAIRSEQ_TRAIN") from None
        stop = threading.Event()
        follower = threading.Thread(target=progress.follow, args=(log, offset, spec.metric, stop.is_set, 0.1),
                                    daemon=True)
        follower.start()
        rc, interrupted = wait(proc)
        stop.set()
        follower.join()
    if interrupted:
        return 130
    if rc != 0:
        rc = 128 - rc if rc < 0 else rc  # killed by a signal: the shell's status
        with open(log, encoding="utf-8", errors="replace") as f:
            errors = [ln.rstrip("\n") for ln in f if _ERROR.match(ln)]
        print(f"{os.path.basename(spec.script)}: error: fairseq-train failed (exit {rc})"
              f"{': ' + errors[-1] if errors else ''}; see {log}", file=sys.stderr, flush=True)
        return rc
    with open(os.path.join(spec.run_dir, "done"), "w") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")
    progress.echo(f"== done: {spec.run_dir} ({score(spec)})")
    if spec.after:
        progress.echo(spec.after)
    return 0
