#!/usr/bin/env python
"""What one run is measured by, from its checkpoints (run.py runs this command; its runs record it).

The command line of recadam_fairseq.compare.measure: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout
from recadam_fairseq.compare.measure import main  # noqa: E402

if __name__ == "__main__":
    main()
