#!/usr/bin/env python3
"""The task scripts' one line: ``launch.py KIND SCRIPT ARGS...`` (recadam_fairseq/launch/command.py has the code).

Any Python 3 may start it: before importing the package it becomes PYTHON, or else the interpreter of FAIRSEQ_TRAIN's
first word (itself when it is a python, else its #! line), so that the checkpoint is read by the torch that trains."""

import os
import shutil
import sys


def interpreter() -> str:
    """PYTHON, else FAIRSEQ_TRAIN's Python: its first word if that is a python, else its #! line's; else this one."""
    if os.environ.get("PYTHON"):
        return os.environ["PYTHON"]
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


if __name__ == "__main__":
    python = interpreter()
    if not os.environ.get("PYTHON") and os.path.abspath(python) != os.path.abspath(sys.executable):
        os.environ["PYTHON"] = python  # (once: the new interpreter keeps itself)
        try:
            os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])
        except OSError as e:
            sys.exit(f"{os.path.basename(sys.argv[2]) if len(sys.argv) > 2 else 'launch.py'}: error: cannot run "
                     f"{python} ({e.strerror}), FAIRSEQ_TRAIN's Python: set PYTHON")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
    from recadam_fairseq.launch.command import main

    sys.exit(main())
