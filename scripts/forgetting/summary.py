#!/usr/bin/env python
"""Which method forgets least across the target tasks: the summary of the per-task results.

The command line of recadam_fairseq.compare.summary (``--help`` says what it does): the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout
from recadam_fairseq.compare.summary import main  # noqa: E402

if __name__ == "__main__":
    main()
