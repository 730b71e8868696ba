#!/usr/bin/env python
"""Merge a LoRA checkpoint (``--arch roberta_ft_* --lora-rank R``) into a plain fairseq RoBERTa checkpoint.

The command line of recadam_fairseq.use.merge_lora: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.use.merge_lora import main  # noqa: E402

if __name__ == "__main__":
    main()
