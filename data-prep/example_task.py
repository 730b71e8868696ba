#!/usr/bin/env python
"""A labelled set you can ship (movie snippets, SNLI pairs) for the own-model walk-through, from two PyPI sdists.

The command line of recadam_fairseq.prepare.example_task: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.prepare.example_task import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
