#!/usr/bin/env python
"""Cost of a set of methods: updates/s and peak memory against each one's base, in one run.

The command line of recadam_fairseq.bench.bench_methods: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.bench.bench_methods import main  # noqa: E402

if __name__ == "__main__":
    main()
