#!/usr/bin/env python
"""Time one optimizer step of RecAdam against Adam implementations, per layout and model size.

The command line of recadam_fairseq.tools.benchmark: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tools.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
