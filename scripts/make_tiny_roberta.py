#!/usr/bin/env python
"""Make a tiny "pretrained" RoBERTa and a tiny GLUE-style classification set, on CPU.

The command line of recadam_fairseq.tiny.make_tiny_roberta: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tiny.make_tiny_roberta import *  # noqa: E402,F401,F403  (for scripts that load this file)
from recadam_fairseq.tiny.make_tiny_roberta import main  # noqa: E402

if __name__ == "__main__":
    main()
