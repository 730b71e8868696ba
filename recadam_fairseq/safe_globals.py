"""Let ``torch.load`` (weights_only, the default since torch 2.6) read fairseq's own checkpoints.

fairseq calls ``torch.load`` without ``weights_only``; torch >= 2.6 then refuses the Python
objects fairseq pickles into its checkpoints. We allow-list exactly those types instead of
switching the safety off. Tools run without ``--user-dir`` can do the same with
``import recadam_fairseq.safe_globals``.
"""

import argparse

import torch

# What fairseq (0.12.x) pickles into checkpoints it writes: the legacy ``args`` namespace.
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]

torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
