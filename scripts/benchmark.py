#!/usr/bin/env python
"""Time one optimizer step of RecAdam against Adam implementations, per layout and model size.

The command line of recadam_fairseq.bench (its parts: workloads, optimizers, timing, tables, e2e, main)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
