#!/usr/bin/env python
"""What R3F costs: updates/s of sentence_prediction vs R3F vs RecAdam + R3F, measured in one run

The command line of recadam_fairseq.bench.bench_r3f: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.bench.bench_r3f import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
