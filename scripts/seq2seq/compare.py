#!/usr/bin/env python
"""The domain-adaptation comparison on a synthetic translation pair: docs/seq2seq-comparison.{md,json,png}.

The command line of recadam_fairseq.compare.seq2seq: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout
from recadam_fairseq.compare.seq2seq import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
