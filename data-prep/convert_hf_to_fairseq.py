#!/usr/bin/env python
"""Convert a Hugging Face encoder of the BERT or RoBERTa family to a fairseq RoBERTa checkpoint and its dictionary.

The command line of recadam_fairseq.prepare.convert_hf: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.prepare.convert_hf import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
