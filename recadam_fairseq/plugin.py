"""Every fairseq component of recadam-fairseq: importing this module registers them (once).

A new optimizer, criterion, task or model adds its import here.
"""

from . import safe_globals  # noqa: F401  (torch.load allow-list for fairseq's checkpoints)
from .criterions import sentence_prediction_recadam  # noqa: F401
from .optim import fairseq_recadam  # noqa: F401
from .criterions import label_smoothed_cross_entropy_r3f  # noqa: F401
