#!/usr/bin/env python
"""A labelled file of yours (TSV, CSV or JSONL) for a converted model, under your task's own name.

The command line of recadam_fairseq.prepare.prepare_task: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.prepare.prepare_task import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
