"""The Python the task scripts run in: PYTHON, else FAIRSEQ_TRAIN's own, so that a checkpoint is read by the torch
that trains on it. Standard library only: scripts/launch.py calls :func:`become_trainers_python` in whatever
Python 3 started it, before anything else of the package is imported."""

import os
import shutil
import sys
from typing import List


def trainers_python() -> str:
    """FAIRSEQ_TRAIN's Python: its first word if that is a python, else that command's #! line's; else this one."""
    first = (os.environ.get("FAIRSEQ_TRAIN") or "fairseq-train").split()[0]
    if os.path.basename(first).startswith("python"):
        return shutil.which(first) or first
    path = shutil.which(first)
    try:
        with open(path, "rb") as f:
            line = f.readline().decode("utf-8", "replace")
    except (TypeError, OSError):
        return sys.executable
    if not (line.startswith("#!") and "python" in line):
        return sys.executable
    words = [w for w in line[2:].split() if not (w.startswith("-") or os.path.basename(w) == "env")]
    return (shutil.which(words[0]) or words[0]) if words else sys.executable


def become_trainers_python(script: str, argv: List[str]) -> None:
    """Run ``script`` ``argv`` again in FAIRSEQ_TRAIN's Python when PYTHON is unset and this is another one (once:
    PYTHON is set for the new one); a Python that cannot run is one line."""
    if os.environ.get("PYTHON"):
        return
    python = trainers_python()
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return
    os.environ["PYTHON"] = python
    try:
        os.execv(python, [python, os.path.abspath(script), *argv])
    except OSError as e:
        sys.exit(f"{os.path.basename(argv[1]) if len(argv) > 1 else 'launch.py'}: error: cannot run {python} "
                 f"({e.strerror}), FAIRSEQ_TRAIN's Python: set PYTHON")
