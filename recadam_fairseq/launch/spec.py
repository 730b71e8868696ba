"""A run of a task script: its fairseq-train argv, its directory, command.sh and run.json, and what a directory that
already holds a run means for it (:meth:`RunSpec.state`: new, unfinished, done, or another command's).

command.sh is the command as a person reads it: ``cd`` to where it ran, the trainer's words on one line, then one
flag and its values a line. Two commands are the same when they hold the same lines in any order (argparse reads
them so): a rerun with the flags in another order resumes, one with another value stops (:class:`Conflict`)."""

import glob
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

_BARE = re.compile(r"[A-Za-z0-9_./:=,+@%-]+")


class Stop(Exception):
    """A one-line error of the script's (exit 2): nothing was written."""


class Conflict(Stop):
    """The run directory holds a run of another command."""


def quote(word: str) -> str:
    """Shell-quoted readably: bare when safe, else in single quotes."""
    return word if _BARE.fullmatch(word) else "'" + word.replace("'", "'\\''") + "'"


def render(argv: List[str], lead: int, cwd: str) -> str:
    """``cd CWD``, the first ``lead`` words on one line, then each flag with its values on a line of its own."""
    lines = [f"cd {quote(cwd)}", " ".join(quote(w) for w in argv[:lead])]
    i = lead
    while i < len(argv):
        line = [quote(argv[i])]
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            line.append(quote(argv[i]))
            i += 1
        lines[-1] += " \\"
        lines.append("  " + " ".join(line))
    return "\n".join(lines)


def flag_lines(text: str) -> List[str]:
    """A rendered command's lines without comments, continuation marks and indent, sorted."""
    return sorted(re.sub(r" *\\$", "", ln).lstrip() for ln in text.splitlines() if ln and not ln.startswith("#"))


def change(old: str, new: str) -> str:
    """What differs between two rendered commands, in a few words: ``was: --lr 2e-5; now: --lr 3e-5``."""
    a, b = Counter(flag_lines(old)), Counter(flag_lines(new))
    gone = [ln for ln in flag_lines(old) if (a - b)[ln]]
    came = [ln for ln in flag_lines(new) if (b - a)[ln]]
    return f"was: {' '.join(dict.fromkeys(gone[:3])) or 'nothing'}; now: {' '.join(dict.fromkeys(came[:3])) or 'nothing'}"


def here() -> str:
    """The working directory as the shell names it ($PWD: a symlinked path stays as typed), else getcwd()."""
    pwd = os.environ.get("PWD")
    try:
        return pwd if pwd and os.path.samefile(pwd, ".") else os.getcwd()
    except OSError:
        return os.getcwd()


def default_save_interval(total: int) -> int:
    """A checkpoint (and a validation) about every tenth of the run, at most every 2000 updates."""
    return min(2000, max(1, (total + 5) // 10))


@dataclass
class RunSpec:
    """One run: ``argv`` (the trainer's ``lead`` words, then its arguments) run in ``cwd``, kept in ``run_dir``."""

    argv: List[str]
    lead: int
    run_dir: str
    title: str  # command.sh's first comment: "RTE recadam seed 1"
    settings: str  # its second: the variables that made it, "LR=2e-5 BATCH=16 ..."
    script: str  # scripts/glue/finetune.sh: who wrote command.sh, the prefix of its lines
    run_json: Optional[Dict[str, object]] = None  # None: no run.json (multitask.sh)
    metric: Optional[str] = None  # the metric of the progress lines and of the end line
    end_metric: Optional[str] = None  # the end line's metric, when not the task's (translation's bleu)
    banner: str = ""  # the line before training: "== RTE recadam seed 1 -> runs/RTE/..."
    after: str = ""  # a line after the run's end
    cwd: str = field(default_factory=lambda: here())

    @property
    def command(self) -> str:
        return render(self.argv, self.lead, self.cwd)

    def has_checkpoints(self) -> bool:
        return bool(glob.glob(os.path.join(self.run_dir, "checkpoint*.pt")))

    def done(self) -> bool:
        return os.path.isfile(os.path.join(self.run_dir, "done"))

    def started(self) -> bool:
        """It trained: a log or checkpoints."""
        return os.path.exists(os.path.join(self.run_dir, "train.log")) or self.has_checkpoints()

    def state(self, restart: bool = False) -> str:
        """``new``, ``unfinished`` (a log or checkpoints: it resumes) or ``done``; ``restart``: ``new`` whatever
        it holds. :class:`Conflict` when the directory holds a started or finished run of another command (a
        command.sh written by a dry run alone is not one)."""
        if restart:
            return "new"
        saved = os.path.join(self.run_dir, "command.sh")
        if os.path.isfile(saved) and (self.started() or self.done()):
            with open(saved, encoding="utf-8") as f:
                old = f.read()
            if flag_lines(old) != flag_lines(self.command):
                raise Conflict(f"{self.run_dir} was started with another command ({change(old, self.command)}): "
                               f"RESTART=1 starts it over with this one, or choose another SAVE_DIR")
        if self.done():
            return "done"
        return "unfinished" if self.started() else "new"

    def clear(self) -> None:
        """RESTART=1: the run's checkpoints, log and done marker deleted (command.sh and run.json are rewritten)."""
        for pattern in ("checkpoint*.pt", "checkpoint*.pt.tmp", "checkpoint_last.pt.bad-*", "done", "train.log"):
            for path in glob.glob(os.path.join(self.run_dir, pattern)):
                os.remove(path)

    def write(self, run_json: bool = True) -> None:
        """command.sh (and ``run_json``: run.json) into the run directory."""
        os.makedirs(self.run_dir, exist_ok=True)
        path = os.path.join(self.run_dir, "command.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"#!/usr/bin/env bash\n# {self.title}, written by {self.script} on "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n# settings: {self.settings}\n{self.command}\n")
        os.chmod(path, 0o755)
        if run_json and self.run_json is not None:
            with open(os.path.join(self.run_dir, "run.json"), "w", encoding="utf-8") as f:
                f.write(json.dumps(self.run_json) + "\n")

