#!/usr/bin/env python
"""Convert a BERT-architecture checkpoint (safetensors + config.json + vocab.txt) to fairseq RoBERTa.

The command line of recadam_fairseq.tools.convert_bert: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tools.convert_bert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
