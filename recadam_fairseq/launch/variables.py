"""The task scripts' variables, read from the environment and checked before anything is written: an empty value is
an unset one (as bash's ``${X:-default}``), a bad one is a one-line :class:`~.spec.Stop` naming the variable."""

import os
import re
import sys
from typing import Callable, List, Mapping, Optional

from .spec import Stop

_NUMBER = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


class Variables:
    """``env`` as one script reads it: ``script`` (finetune.sh) prefixes its notes, ``dry_run`` is DRY_RUN=1."""

    def __init__(self, env: Mapping[str, str], script: str, say: Optional[Callable[[str], None]] = None,
                 cuda: Optional[bool] = None):
        self.env, self.script = dict(env), script
        self.cuda = cuda  # whether the machine that trains has CUDA (None: this one, asked of torch)
        self.say = say if say is not None else (lambda msg: print(f"{script}: {msg}", file=sys.stderr, flush=True))
        self.dry_run = self.get("DRY_RUN") == "1"
        self.restart = self.get("RESTART") == "1"

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        value = self.env.get(name)
        return value if value else default

    def whole(self, name: str, default=None, minimum: int = 1) -> Optional[int]:
        """A whole number of at least ``minimum`` (0 or 1), ``default`` when unset: every script's one check of one."""
        value = self.get(name, None if default is None else str(default))
        if value is None:
            return None
        if not value.isdigit() or int(value) < minimum:
            raise Stop(f"{name} must be a {'positive' if minimum else 'non-negative'} integer, got '{value}'")
        return int(value)

    def number(self, name: str, what: str) -> Optional[str]:
        value = self.get(name)
        if value is not None and not _NUMBER.fullmatch(value):
            raise Stop(f"{name} must be a number ({what}), got '{value}'")
        return value

    def choice(self, name: str, default: str, choices: List[str], message: str) -> str:
        value = self.get(name, default)
        if value not in choices:
            raise Stop(message.format(value=value))
        return value

    def fp16(self) -> str:
        return self.choice("FP16", "auto", ["0", "1", "auto"], "FP16 must be 0, 1 or auto, got '{value}'")

    def trainer(self) -> List[str]:
        """FAIRSEQ_TRAIN's words [fairseq-train] (it may hold several: ``python train.py``)."""
        return self.get("FAIRSEQ_TRAIN", "fairseq-train").split()

    def user_dir(self) -> str:
        return self.get("USER_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def problems(self, found: List[str]) -> None:
        """Inputs that are missing, all said at once: a run stops (a Stop of a line each), a dry run goes on with a
        warning each (it only writes the command)."""
        if found and not self.dry_run:
            raise Stop("\n".join(found))
        for p in found:
            self.say(f"warning: {p}")
