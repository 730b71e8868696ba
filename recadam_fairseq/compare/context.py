"""RunContext: what every run of one invocation shares, fixed before the first run starts."""

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from recadam_fairseq.engine import methods


@dataclass(frozen=True)
class RunContext:
    """The command line and what main() found before running: the data of the task, the converted model, the
    runs recorded before. ``opts`` is parse_args()'s namespace (its defaults filled in), read only from here
    on; a variant is ``ctx.with_options(...)``."""

    opts: argparse.Namespace
    runs_dir: str  # WORK/runs[-TASK]: one directory per setting and seed
    data_key: str  # the data settings as JSON: a recorded run counts only on the same data
    prior: Mapping[Tuple[str, int], dict]  # (name, seed) -> the run recorded in RESULTS.json (--fresh: none)
    pretrained: str  # the converted model.pt: --restore-file, θ*
    arch: Tuple[str, ...]  # its architecture flags
    num_layers: int
    snli: Optional[str]  # the probe's binarized sentences and pairs
    glue: Optional[str]  # the glue_multitask layout of the target(s): freeze, ca-mtl
    sentiment: Optional[str] = None  # the target's binarized data (one task)
    targets: Optional[Mapping[str, str]] = None  # {task: binarized data}: the multi-task setting
    mt_task: str = methods.MT_TASK  # glue_multitask's --mt-tasks
    num_classes: Optional[int] = 2
    multitask: bool = False
    fisher: Optional[str] = None  # EWC's Fisher file of the target data (ewc_fisher.py), for --ewc-fisher task

    def with_options(self, **changes) -> "RunContext":
        """The same context with some options changed (a copy: this one stays as it is)."""
        return dataclasses.replace(self, opts=argparse.Namespace(**{**vars(self.opts), **changes}))
