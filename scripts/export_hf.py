#!/usr/bin/env python
"""Export a fine-tuned sentence classifier to Hugging Face's RobertaForSequenceClassification (safetensors).

The command line of recadam_fairseq.use.export_hf: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.use.export_hf import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
