"""The checkpoints fairseq-train is told to load, read with the plug-in's loader before fairseq touches them.

``--restore-file``, ``--finetune-from-model``, a resumed run's ``SAVE_DIR/checkpoint_last.pt`` and the file of
``--ewc-fisher FILE``: a file that carries code (refused), is cut short or is no fairseq checkpoint (no Fisher
file, or none at all) stops the run in one line, before fairseq creates ``--save-dir`` or logs anything
(core/checkpoint_file.py's words, as every other reader of a file).

fairseq's ``main`` creates the save directory and logs its config before it builds any component, and loads the
file after that; the plug-in's one point before both is its own import (``--user-dir``, during fairseq's
argument parsing). So the files are read from the command line, with fairseq's exact flag names (its parser
takes no abbreviations) and Hydra's ``checkpoint.*=`` overrides. Files named only in a Hydra yaml are not seen
here: fairseq's own failure on them is one line too (errors_hook.py), after it made the directory.
"""

import os
import sys
from typing import Dict, List, Tuple

from .. import safe_globals  # noqa: F401  (the types fairseq pickles)
from ..core import checkpoint_file, ewc

FLAGS = {"--restore-file": ("checkpoint.restore_file",), "--finetune-from-model": ("checkpoint.finetune_from_model",),
         "--save-dir": ("checkpoint.save_dir",), ewc.FLAG: ("criterion.ewc_fisher", "optimizer.ewc_fisher")}
TRAINERS = ("fairseq_cli.train", "fairseq_cli.hydra_train")  # the processes that load these files


def named(argv: List[str]) -> Dict[str, str]:
    """{flag: value} of FLAGS on a command line (the last one of each, as argparse keeps it)."""
    out = {}
    hydra = {key: flag for flag, keys in FLAGS.items() for key in keys}
    for i, a in enumerate(argv):
        key, eq, value = a.partition("=")
        if key in FLAGS and eq:
            out[key] = value
        elif a in FLAGS and i + 1 < len(argv):
            out[a] = argv[i + 1]
        elif key.lstrip("+") in hydra and eq:
            out[hydra[key.lstrip("+")]] = value
    return out


def files(argv: List[str]) -> List[Tuple[str, str]]:
    """(what, path) of each existing file fairseq's restore rule may load (a missing one is config.py's error), and
    --ewc-fisher's file, missing or not (nothing checks it before fairseq makes --save-dir)."""
    v = named(argv)
    out = [("--finetune-from-model", v["--finetune-from-model"])] if v.get("--finetune-from-model") else []
    restore = v.get("--restore-file", "checkpoint_last.pt")
    if restore == "checkpoint_last.pt":
        out.append(("resuming from", os.path.join(v.get("--save-dir", "checkpoints"), restore)))
    elif restore:
        out.append(("--restore-file", restore))
    out = [(what, path) for what, path in out if os.path.isfile(path)]
    if v.get(ewc.FLAG, ewc.TASK) not in (ewc.TASK, ""):  # "": EWC off
        out.append((ewc.FLAG, v[ewc.FLAG]))
    return out


def check(argv=None) -> None:
    """Read each file; raises CheckpointFileError (a ConfigError: one line) naming the flag and the file."""
    if not any(m in sys.modules for m in TRAINERS):
        return
    argv = sys.argv[1:] if argv is None else argv
    if not named(argv):
        return
    for what, path in files(argv):
        if what == ewc.FLAG:
            ewc.load(path, mmap=True)  # the tensors are read where F is built
        else:
            checkpoint_file.fairseq_state(path, f"{what} {path}")
