"""The task scripts' command line: ``scripts/launch.py KIND SCRIPT ARGS...`` (each script is that one line).

    finetune  scripts/glue/finetune.sh TASK METHOD [extra fairseq-train args...]
    multitask scripts/glue/multitask.sh [extra fairseq-train args...]
    seq2seq   scripts/seq2seq/finetune.sh METHOD [extra fairseq-train args...]
    grid      scripts/glue/grid.sh TASK [extra fairseq-train args...]   (launch/grid.py)
    tune      scripts/glue/tune.sh TASK [extra fairseq-train args...]   (launch/search.py)
    demo      scripts/demo.sh, scripts/ewc_demo.sh: OUT [--ewc] [--jobs N] METHOD...   (launch/demo.py)

A script's --help is its header comment, then (for those that take a METHOD) the catalogue's METHODs and their
variables. Its errors are one line, ``finetune.sh: error: ...`` (exit 2), before anything is written."""

import os
import sys
from typing import Dict, List, Optional

from recadam_fairseq.launch import prelaunch

from . import glue, multitask, translation
from .spec import RunSpec, Stop
from .train import INTERRUPTED, score, train
from .variables import Variables

# KIND: (what it expects, the catalogue's METHODs it lists: prelaunch.methods_help's arguments, or None)
KINDS = {"finetune": ("TASK METHOD", (False, False)), "multitask": ("", (True, False)),
         "seq2seq": ("METHOD", (False, True)), "grid": ("TASK", None), "tune": ("TASK", None),
         "demo": ("OUT METHOD", None)}


def usage(script: str, kind: str) -> str:
    """The script's header comment (up to ``set -euo pipefail``), then its METHODs from the catalogue."""
    with open(script, encoding="utf-8") as f:
        lines = f.read().split("\nset -euo pipefail", 1)[0].splitlines()[1:]
    text = "\n".join(ln[2:] if ln.startswith("# ") else ln[1:] for ln in lines)
    listed = KINDS[kind][1]
    return text + ("\n\n" + prelaunch.methods_help(*listed) if listed else "")


def build(kind: str, v: Variables, args: List[str]) -> RunSpec:
    """The run a script's ``args`` make under the variables ``v``."""
    if kind == "finetune":
        return glue.build(v, args[0], args[1], args[2:])
    if kind == "seq2seq":
        return translation.build(v, args[0], args[1:])
    return multitask.build(v, args)


def launch(spec: RunSpec, v: Variables, trainer=None, out=None) -> int:
    """What a run directory holds decides: RESTART=1 clears it; a finished run is not trained again; a started run
    of another command stops (:class:`~.spec.Conflict`); DRY_RUN=1 writes command.sh and prints it. Else train:
    ``trainer(spec, say)`` (default: launch/train.py's, here), its lines to ``out`` (default: stdout)."""
    from recadam_fairseq.launch.progress import echo  # (its log reader loads the engine: not for --help or an error)

    echo = out or echo

    state = spec.state(v.restart)
    if v.restart and os.path.isdir(spec.run_dir) and not v.dry_run:
        v.say(f"RESTART=1: starting {spec.run_dir} over")
        spec.clear()
    elif state == "done" and not v.dry_run:
        echo(f"== already done: {spec.run_dir} ({score(spec)}; RESTART=1 trains it again)")
        return 0
    spec.write(run_json=not v.dry_run)
    if v.dry_run:
        with open(os.path.join(spec.run_dir, "command.sh"), encoding="utf-8") as f:
            echo(f.read().rstrip("\n"))
        return 0
    echo(spec.banner)
    return (trainer or train)(spec, v.say)


def main(argv: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None) -> int:
    kind, script, *args = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(script)
    if args[:1] in (["-h"], ["--help"]):
        print(usage(script, kind))
        return 0
    expects = KINDS[kind][0]
    if len(args) < len(expects.split()):
        print(usage(script, kind), file=sys.stderr)
        print(f"{prog}: error: expected {expects}", file=sys.stderr)
        return 2
    try:
        if kind == "grid":
            from recadam_fairseq.launch import grid

            return grid.main(args)
        if kind == "tune":
            from recadam_fairseq.launch import search

            return search.main(args)
        if kind == "demo":
            from . import demo

            return demo.main([script, *args])
    except KeyboardInterrupt:  # (each run's launcher got it too, and waits for its trainer)
        return INTERRUPTED
    v = Variables(os.environ if env is None else env, prog)
    extra = args[len(expects.split()):]
    try:
        if "-h" in extra or "--help" in extra:  # fairseq-train's own help: no run directory, no done marker
            try:
                os.execvp(v.trainer()[0], v.trainer() + ["--help"])
            except OSError as e:
                raise Stop(f"cannot run {v.trainer()[0]} ({e.strerror}): set FAIRSEQ_TRAIN") from None
        return launch(build(kind, v, args), v)
    except Stop as e:
        say_error(prog, e)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before training (reading the checkpoint): nothing more to say
        return INTERRUPTED


def say_error(prog: str, e: Stop) -> None:
    """A Stop's lines (several missing inputs are said at once), each ``PROG: error: ...``."""
    for line in str(e).splitlines():
        print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
