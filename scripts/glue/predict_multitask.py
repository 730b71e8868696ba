#!/usr/bin/env python3
"""Test-set predictions of a ``--task glue_multitask`` checkpoint, in GLUE's submission format.

The command line of recadam_fairseq.use.predict_multitask: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # run from a checkout
from recadam_fairseq.use.predict_multitask import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
