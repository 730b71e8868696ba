#!/usr/bin/env python
"""WiSE-FT: a fine-tuned fairseq checkpoint mixed with its pretrained weights, θ_α = (1 − α)·θ* + α·θ_ft.

The command line of recadam_fairseq.use.interpolate: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.use.interpolate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
