#!/usr/bin/env python
"""The forgetting harness on the GPU machine (no network, no BERT package there): what it needs, in

The command line of recadam_fairseq.tools.forgetting_pack: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # run from a checkout
from recadam_fairseq.tools.forgetting_pack import main  # noqa: E402

if __name__ == "__main__":
    main()
