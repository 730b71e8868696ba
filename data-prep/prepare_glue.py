#!/usr/bin/env python
"""Binarize the GLUE tasks for fairseq's ``sentence_prediction`` task (RoBERTa GPT-2 BPE).

The command line of recadam_fairseq.prepare.prepare_glue: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.prepare.prepare_glue import *  # noqa: E402,F401,F403  (for scripts that load this file)
from recadam_fairseq.prepare.prepare_glue import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
