#!/usr/bin/env python
"""Binarize a forgetting-meter probe (--forgetting-probe DIR) from a text or pair file with the model's dictionary.

The command line of recadam_fairseq.prepare.binarize_probe: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.prepare.binarize_probe import main  # noqa: E402

if __name__ == "__main__":
    main()
