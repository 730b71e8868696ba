"""R3F (Aghajanyan et al., 2020, "Better Fine-Tuning by Reducing Representational Collapse"): pure torch.

The R3F loss is L(f(x), y) + λ·KL_S(f(x) ‖ f(x + z)), z ~ U(−ε, ε) or N(0, ε²) on the token embeddings.
This module holds the math: the noise, and the consistency terms (KL_S; for a regression head, the squared
difference), which R-Drop (``rdrop.py``) takes between its two dropout passes. The fairseq criteria call
it. No fairseq import.

The draws match fairseq's ``examples/rxf`` (``torch.distributions`` on the default CPU generator, fp32,
then moved to the embeddings' device), so a run with the same seed sees the same noise.
"""

import torch
import torch.nn.functional as F

from .errors import ConfigError

NOISE_TYPES = ("uniform", "normal")


def check_hyperparams(eps: float, r3f_lambda: float, noise_type: str) -> None:
    """Reject what fairseq's version would silently take or fail on mid-run; messages name the flags."""
    if not eps >= 0:  # also NaN
        raise ConfigError(f"--eps must be >= 0 (the noise range/std), got {eps}")
    if not r3f_lambda >= 0:
        raise ConfigError(f"--r3f-lambda must be >= 0 (the weight of the consistency term), got {r3f_lambda}")
    if str(noise_type) not in NOISE_TYPES:
        raise ConfigError(f"--noise-type must be one of {', '.join(NOISE_TYPES)}, got {noise_type!r}")


def sample_noise(shape, eps: float, noise_type: str, generator=None) -> torch.Tensor:
    """fp32 noise on the CPU: U(−ε, ε) as low + rand·(high − low), or N(0, ε²) as normal(0, 1)·ε + 0,
    the float operations torch.distributions.Uniform/Normal.sample perform (same draws, same bits)."""
    if noise_type == "uniform":
        low, high = torch.tensor(-eps), torch.tensor(eps)
        return low + torch.rand(shape, generator=generator) * (high - low)
    if noise_type == "normal":
        loc, scale = torch.tensor(0.0).expand(shape), torch.tensor(eps).expand(shape)
        return torch.normal(loc, scale, generator=generator)
    raise ConfigError(f"--noise-type must be one of {', '.join(NOISE_TYPES)}, got {noise_type!r}")


def add_noise(embeddings: torch.Tensor, noise: torch.Tensor, detach: bool = True, generator=None) -> torch.Tensor:
    """embeddings + noise; ``detach``: cut from the embeddings' graph (fairseq's GLUE version does,
    its seq2seq version does not).

    fp32 embeddings: the fp32 sum, bit for bit fairseq's. Half precision (fp16/bf16): a noise of 1e-5 is
    below half of an fp16 step for embeddings above ~0.02 (step 1.5e-5), so round-to-nearest drops much
    of it, and always in the same direction for a given value. The sum is computed in fp32 and rounded
    *stochastically* to one of its two neighbouring half values (probability by distance): the noised
    input equals embeddings + noise in expectation, so the noise survives (at the cost of a second
    uniform draw, in half precision only).
    """
    base = embeddings.detach() if detach else embeddings
    noise = noise.to(device=base.device)
    if base.dtype == torch.float32:
        return base + noise  # fairseq: .to(embeddings) then add (fp32: identical)
    noised = stochastic_round(base.detach().float() + noise.float(), base.dtype, generator)
    return noised if detach else base + (noised - base).detach()  # values: noised; gradient: identity


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, generator=None) -> torch.Tensor:
    """Round fp32 ``x`` to ``dtype`` up or down with probability by distance (unbiased: E[result] = x)."""
    near = x.to(dtype)
    near32 = near.float()
    toward = torch.where(near32 > x, torch.full_like(near, float("-inf")), torch.full_like(near, float("inf")))
    other = torch.nextafter(near, toward)
    gap = (other.float() - near32).abs()
    p_other = ((x - near32).abs() / gap).nan_to_num(0.0)  # gap inf at the range's edge: keep near
    u = torch.rand(x.shape, generator=generator).to(x.device)
    return torch.where(u < p_other, other, near)


def symm_kl(noised_logits: torch.Tensor, input_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_clean ‖ p_noised) + KL(p_noised ‖ p_clean) summed over all positions, over the batch size
    (dim 0), in fp32: fairseq's term, the same float operations."""
    return symm_kl_sum(noised_logits, input_logits) / noised_logits.size(0)


def symm_kl_sum(p_logits: torch.Tensor, q_logits: torch.Tensor, pad_mask=None) -> torch.Tensor:
    """KL(p ‖ q) + KL(q ‖ p) of the softmaxes of the last dim, summed over every position but those where
    ``pad_mask`` (the logits' shape without the last dim) is True: R-Drop's seq2seq term leaves padding out.
    (The operations in fairseq's order: autograd sums the logits' gradients in the order they were made.)"""
    pq = F.kl_div(F.log_softmax(p_logits, dim=-1, dtype=torch.float32),
                  F.softmax(q_logits, dim=-1, dtype=torch.float32), None, None, "sum" if pad_mask is None else "none")
    qp = F.kl_div(F.log_softmax(q_logits, dim=-1, dtype=torch.float32),
                  F.softmax(p_logits, dim=-1, dtype=torch.float32), None, None, "sum" if pad_mask is None else "none")
    if pad_mask is None:
        return pq + qp
    pad = pad_mask.unsqueeze(-1)
    return pq.masked_fill(pad, 0.0).sum() + qp.masked_fill(pad, 0.0).sum()


def regression_consistency(noised_pred: torch.Tensor, input_pred: torch.Tensor) -> torch.Tensor:
    """For a scalar output (STS-B): Σ (f(x+z) − f(x))² over the batch size, in fp32.

    This is the symmetric KL of unit-variance Gaussians centred on the two predictions
    (KL(N(a,1)‖N(b,1)) = (a−b)²/2 each way), so it plays the role symm_kl plays for classes;
    fairseq's version computes a KL over a single class there, which is 0 (no regularization).
    """
    d = noised_pred.float().view(-1) - input_pred.float().view(-1)
    return (d * d).sum() / noised_pred.size(0)
