"""Sharpness-aware perturbations and the Fisher mask (pure torch; no fairseq import).

The methods, each as its paper defines it:

- SAM, Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
  ICLR 2021: g = ∇L(θ), ε = ρ·g/‖g‖, the update uses ∇L(θ+ε); θ is then restored exactly.
- ESAM, Du et al., "Efficient Sharpness-aware Minimization for Improved Training of Neural
  Networks", ICLR 2022: stochastic weight perturbation (each parameter tensor is perturbed with
  probability β, ε scaled by 1/β) and sharpness-sensitive data selection (the second pass uses the
  γ-fraction of examples whose loss rose most under ε).
- GSAM, Zhuang et al., "Surrogate Gap Guided Sharpness-Aware Minimization", ICLR 2022: ρ_t follows
  the learning rate between ρ_min and ρ_max, and the update direction is ∇L(θ+ε) − α·g_⊥ where
  g_⊥ is the component of ∇L(θ) orthogonal to ∇L(θ+ε).
- FSAM, Zhong et al., "Improving Sharpness-Aware Minimization with Fisher Mask for Better
  Generalization on Language Models", Findings of EMNLP 2022: ε only on the top ``keep_ratio``
  fraction of the parameters by empirical Fisher information (squared gradients); biases and
  embeddings stay outside the competition (as in the authors' code they are perturbed unmasked).

Everything here works on lists of tensors aligned with a model's parameters (``None`` where a
parameter has no gradient / is not perturbed).
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .errors import ConfigError

SAM_TYPES = ("none", "sam", "esam", "gsam", "fisher-sam", "fisher-esam", "fisher-gsam")
NORM_EPS = 1e-12  # added to ‖g‖ (Foret et al.'s reference code); ρ = 0 gives ε = 0 exactly

def validate_sam_hparams(hp: Dict, names: Optional[Dict[str, str]] = None) -> None:
    """Raise ConfigError naming the flag (``--key-name`` unless ``names`` says) of an out-of-range hyperparameter."""
    n = {k: (names or {}).get(k, "--" + k.replace("_", "-")) for k in hp}
    st = str(hp["sam_type"])
    if st not in SAM_TYPES:
        raise ConfigError(f"{n['sam_type']} {st!r} is unknown: choose one of {', '.join(SAM_TYPES)}")
    if not hp["rho"] >= 0:
        raise ConfigError(f"{n['rho']} must be >= 0 (the radius of the perturbation), got {hp['rho']}")
    for k in ("beta", "gamma", "keep_ratio"):
        if not 0 < hp[k] <= 1:
            raise ConfigError(f"{n[k]} must be in (0, 1], got {hp[k]}")
    if not (hp["mask_iter_e"] >= 1 and float(hp["mask_iter_e"]).is_integer()):
        raise ConfigError(f"{n['mask_iter_e']} must be an integer >= 1 (updates between Fisher masks), "
                         f"got {hp['mask_iter_e']}")
    if not hp["num_samples"] >= 1:
        raise ConfigError(f"{n['num_samples']} must be >= 1, got {hp['num_samples']}")
    if not hp["gsam_alpha"] >= 0:
        raise ConfigError(f"{n['gsam_alpha']} must be >= 0, got {hp['gsam_alpha']}")
    if not 0 <= hp["rho_min"] <= hp["rho"]:
        raise ConfigError(f"{n['rho_min']} must be in [0, {n['rho']}] (GSAM's ρ_t runs from {n['rho']} at the "
                         f"peak learning rate down to {n['rho_min']}), got {hp['rho_min']} with {n['rho']} {hp['rho']}")


def uses_mask(sam_type: str) -> bool:
    return sam_type.startswith("fisher-")


def base_type(sam_type: str) -> str:
    """'fisher-esam' -> 'esam'."""
    return sam_type[len("fisher-"):] if uses_mask(sam_type) else sam_type


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """At least fp32 (fp64 stays fp64): where sums and norms of gradients are taken."""
    return torch.promote_types(t.dtype, torch.float32)


def global_norm(tensors: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
    """‖(t_1, ..., t_n)‖₂ in at least fp32 (a 0-dim tensor; 0 when there is nothing)."""
    ts = [t for t in tensors if t is not None]
    if not ts:
        return torch.zeros(())
    norms = [torch.linalg.vector_norm(t, dtype=accumulation_dtype(t)) for t in ts]
    dt = norms[0].dtype
    return torch.linalg.vector_norm(torch.stack([x.to(dt) for x in norms]))


def perturbation(grads: Sequence[Optional[torch.Tensor]], rho: float, divisor: float = 1.0,
                 masks: Optional[Sequence[Optional[torch.Tensor]]] = None) -> Tuple[List[Optional[torch.Tensor]], torch.Tensor]:
    """ε_i = ρ / divisor · g_i / (‖g‖ + NORM_EPS), times mask_i where a mask is given.

    ‖g‖ is taken over all given gradients (the mask only selects where ε lands, as in FSAM).
    ``divisor`` is ESAM's β (and FSAM-GSAM's keep ratio), which keeps the expected norm of ε at ρ.
    Returns (ε list, ‖g‖).
    """
    norm = global_norm(grads)
    scale = rho / (divisor * (norm.item() + NORM_EPS))
    eps = []
    for i, g in enumerate(grads):
        if g is None:
            eps.append(None)
            continue
        e = g.to(accumulation_dtype(g)) * scale
        m = None if masks is None else masks[i]
        if m is not None:
            e = e * m
        eps.append(e)
    return eps, norm


def esam_select_params(n: int, beta: float, generator: torch.Generator) -> List[bool]:
    """ESAM's stochastic weight perturbation: each of n tensors is kept with probability β."""
    if beta >= 1:
        return [True] * n
    return (torch.rand(n, generator=generator, dtype=torch.float64) < beta).tolist()


def esam_select_examples(loss_before: torch.Tensor, loss_after: torch.Tensor, gamma: float) -> torch.Tensor:
    """ESAM's sharpness-sensitive data selection: indices (ascending) of the max(1, ⌊γ·n⌋) examples whose
    loss rose most under ε."""
    n = loss_before.numel()
    k = n if gamma >= 1 else max(1, int(n * gamma))
    if k >= n:
        return torch.arange(n, device=loss_before.device)
    rise = (loss_after - loss_before).reshape(-1)
    return torch.topk(rise, k, sorted=False).indices.sort().values


def mask_eligible(name: str) -> bool:
    """Which parameters compete for the Fisher mask: not biases, not embeddings (the authors' rule, by name)."""
    return "bias" not in name and "embed" not in name


def top_k_mask(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest elements of the 1-D ``flat``; among elements equal to the k-th largest,
    the first ones (lowest index) are kept, so the mask is a function of the values alone.

    The k-th largest value comes from ``topk`` (on CUDA far faster than ``kthvalue`` for one long
    tensor, pytorch#75599); only the ties at it are listed.
    """
    n = flat.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=flat.device)
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=flat.device)
    t = torch.topk(flat, k, sorted=False).values.min()
    keep = flat > t
    need = k - int(keep.sum())
    if need > 0:
        keep[(flat == t).nonzero().squeeze(1)[:need]] = True
    return keep


def fisher_mask(fisher: Sequence[Optional[torch.Tensor]], keep_ratio: float) -> List[Optional[torch.Tensor]]:
    """Exact top-k of the empirical Fisher information over all eligible elements together.

    ``fisher`` holds g² for eligible tensors and None elsewhere; k = max(1, ⌊keep_ratio·N⌋) of the N
    eligible elements get True; ties at the threshold go to the earliest elements (tensor order, then
    row-major, :func:`top_k_mask`). Returns bool masks (None where ``fisher`` is None).
    """
    idx = [i for i, f in enumerate(fisher) if f is not None]
    out: List[Optional[torch.Tensor]] = [None] * len(fisher)
    if not idx:
        return out
    flat = torch.cat([fisher[i].reshape(-1).to(accumulation_dtype(fisher[i])) for i in idx])
    keep = top_k_mask(flat, max(1, int(flat.numel() * keep_ratio)))
    del flat
    off = 0
    for i in idx:
        n = fisher[i].numel()
        out[i] = keep[off:off + n].view(fisher[i].shape)
        off += n
    return out


def gsam_rho(rho_max: float, rho_min: float, lr: float, lr_max: float, lr_min: float = 0.0) -> float:
    """ρ_t proportional to the learning rate: ρ_min + (ρ_max − ρ_min)·(lr − lr_min)/(lr_max − lr_min), clamped."""
    if lr_max <= lr_min:
        return rho_max
    frac = min(1.0, max(0.0, (lr - lr_min) / (lr_max - lr_min)))
    return rho_min + (rho_max - rho_min) * frac


def gsam_decompose(g_h: Sequence[Optional[torch.Tensor]], g: Sequence[Optional[torch.Tensor]], alpha: float) -> None:
    """In place: g_h ← g_h − α·(g − (⟨g, g_h⟩/‖g_h‖²)·g_h), GSAM's update direction.

    g_h = ∇L(θ+ε) (the surrogate's gradient), g = ∇L(θ), both in the same units. The dot product and norms
    are taken in at least fp32; each g_h is written back in its own dtype.
    """
    pairs = [(a, b) for a, b in zip(g_h, g) if a is not None and b is not None]
    if not pairs or alpha == 0:
        return
    dt = accumulation_dtype(pairs[0][0])
    dot = sum((a.to(dt) * b.to(dt)).sum() for a, b in pairs)
    nh2 = sum((a.to(dt) * a.to(dt)).sum() for a, _ in pairs)
    coef = (dot / (nh2 + NORM_EPS ** 2)).item()
    for a, b in pairs:
        a32 = a.to(dt)
        a.copy_(a32 - alpha * (b.to(dt) - coef * a32))


class Perturbed:
    """θ ← θ + ε in place, remembering the original values so that :meth:`restore` is bit exact.

    (Subtracting ε back is not exact in floating point, least of all in fp16.)
    """

    def __init__(self):
        self._saved: List[Tuple[torch.Tensor, torch.Tensor]] = []

    @torch.no_grad()
    def apply(self, params: Sequence[torch.Tensor], eps: Sequence[Optional[torch.Tensor]]) -> None:
        self.restore()
        for p, e in zip(params, eps):
            if e is None:
                continue
            self._saved.append((p, p.detach().clone()))
            p.add_(e.to(p.dtype))

    @torch.no_grad()
    def restore(self) -> bool:
        """Put back the saved values; True if anything was perturbed."""
        had = bool(self._saved)
        for p, orig in self._saved:
            p.copy_(orig)
        self._saved = []
        return had

    @property
    def active(self) -> bool:
        return bool(self._saved)
