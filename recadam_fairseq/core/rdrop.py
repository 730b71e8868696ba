"""R-Drop (Liang et al., 2021, "R-Drop: Regularized Dropout for Neural Networks"): pure torch.

R-Drop's loss is R3F's consistency term without the noise, between two dropout passes f₁, f₂ of the batch,
with the task loss of both passes: ½·(L(f₁(x), y) + L(f₂(x), y) + α·½·KL_S(f₁(x) ‖ f₂(x))). The term is
R3F's (``r3f.py``: ``symm_kl``; ``symm_kl_sum`` with a padding mask for seq2seq; ``regression_consistency``
for a regression head); this module holds the rest of the math: α's check, the batch's copy and the loss.
The fairseq criteria call it. No fairseq import.
"""

import torch

from .errors import ConfigError


def check_rdrop_alpha(alpha: float) -> None:
    if not 0 <= alpha < float("inf"):  # also NaN
        raise ConfigError(f"--rdrop-alpha must be a finite number >= 0 (the weight of R-Drop's consistency term), "
                          f"got {alpha}")


def twice(net_input: dict) -> dict:
    """The batch followed by its copy along dim 0 (nested dicts too): one forward of 2B rows gives two
    passes of the batch whose dropout draws are independent (dropout draws each element's mask apart)."""
    return {k: torch.cat([v, v]) if torch.is_tensor(v) else twice(v) if isinstance(v, dict) else v
            for k, v in net_input.items()}


def rdrop_loss(task_loss_both: torch.Tensor, consistency: torch.Tensor, alpha: float) -> torch.Tensor:
    """The authors' loss over 2, ½·(L₁ + L₂ + α·½·S): ``task_loss_both`` = L₁ + L₂ (summed over both
    passes' examples), ``consistency`` = S, summed over the batch (R3F's KL_S, or its squared difference
    for a regression). Over 2: the task part is the mean of the passes, on the scale of one pass's loss."""
    return 0.5 * task_loss_both + (0.25 * alpha) * consistency
