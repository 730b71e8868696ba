#!/usr/bin/env python
"""Label sentences or sentence pairs with a fine-tuned run (single-task, multi-task, LoRA, interpolated), offline.

The command line of recadam_fairseq.use.predict: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout
from recadam_fairseq.use.predict import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
