"""R-Drop's consistency term for GLUE-style heads (``--rdrop-alpha`` > 0), added to the criterion's loss.

Two dropout passes of the batch in one forward of 2B rows (``core/rdrop.py``'s ``twice``) and R3F's term
between them (``r3f_term.consistency``: KL_S, or for a regression head the squared difference), logged as R3F's
``symm_kl`` (``r3f_term.reduce_symm_kl``). The loss of both passes: ``core/rdrop.rdrop_loss``.
"""

from ..core import rdrop
from .glue_core import head_logits
from .r3f_term import consistency


def two_passes_and_consistency(model, net_input, head: str, regression: bool):
    """(both passes' logits, 2B rows: the batch, then its copy; the consistency term between the
    two passes over the batch size). One forward of the batch twice over: each copy its own dropout draws."""
    logits = head_logits(model, rdrop.twice(net_input), head)
    first, second = logits.chunk(2)
    return logits, consistency(regression)(second, first)
