#!/usr/bin/env python
"""What CA-MTL's conditional modules cost on top of RoBERTa: parameters and training-step time.

The command line of recadam_fairseq.bench.ca_mtl_overhead: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.bench.ca_mtl_overhead import main  # noqa: E402

if __name__ == "__main__":
    main()
