#!/usr/bin/env python3
"""What the GLUE task scripts (finetune.sh, grid.sh, multitask.sh) ask Python before fairseq-train (--help: plan,
resume, follow, methods; the scripts eval plan's stdout).

The command line of recadam_fairseq.tools.prelaunch: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # run from a checkout
from recadam_fairseq.tools.prelaunch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
