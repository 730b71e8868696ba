#!/usr/bin/env python3
"""Summarize GLUE fine-tuning runs made by scripts/glue/finetune.sh and grid.sh (--help: what it writes).

The command line of recadam_fairseq.engine.summarize: the code is there (read / aggregate / write)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # run from a checkout
from recadam_fairseq.engine.summarize import main  # noqa: E402

if __name__ == "__main__":
    main()
