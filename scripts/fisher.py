#!/usr/bin/env python
"""EWC's Fisher file: the empirical Fisher of a task's training set at the pretrained weights (--ewc-fisher FILE).

The command line of recadam_fairseq.tools.fisher: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tools.fisher import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
