#!/usr/bin/env python
"""What each method costs inside real fairseq-train: ms per update and peak memory, against its base.

The command line of recadam_fairseq.bench.e2e_overhead: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # run from a checkout
from recadam_fairseq.bench.e2e_overhead import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
