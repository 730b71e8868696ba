"""Weight-space interpolation (WiSE-FT, Wortsman et al. 2022): θ_α = (1 − α)·θ* + α·θ_ft.

Pure torch, on plain state dicts. Every floating tensor of the fine-tuned state whose name the
pretrained state has, with the same shape, is interpolated; every other tensor (classification
heads, modules the fine-tuned model added, integer buffers) is θ_ft's. α = 0 gives θ*'s tensors and
α = 1 θ_ft's, bit for bit (both in θ_ft's dtype).
"""

from typing import Dict, List, Mapping

import torch
from torch import Tensor

from .errors import ConfigError


def check_alpha(alpha, flag: str = "--alpha") -> float:
    """α as a float in [0, 1]; anything else raises ConfigError naming ``flag``."""
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {alpha!r}: not a number") from None
    if not 0.0 <= a <= 1.0:  # also catches nan
        raise ConfigError(f"{flag} {alpha}: must be in [0, 1] (0: the pretrained weights, 1: the fine-tuned ones)")
    return a


def shared_names(finetuned: Mapping[str, Tensor], pretrained: Mapping[str, Tensor]) -> List[str]:
    """The fine-tuned state's floating tensors that the pretrained state has under the same name and shape."""
    return [k for k, v in finetuned.items()
            if torch.is_tensor(v) and v.is_floating_point() and k in pretrained and torch.is_tensor(pretrained[k])
            and pretrained[k].is_floating_point() and pretrained[k].shape == v.shape]


def _mix(ft: Tensor, pre: Tensor, alpha: float) -> Tensor:
    if alpha == 1.0:
        return ft.clone()
    if alpha == 0.0:
        return pre.to(dtype=ft.dtype, copy=True)
    # fp16 / bf16 are computed in fp32, fp32 and fp64 in their own precision (torch.lerp: one rounding)
    work = ft.dtype if ft.dtype in (torch.float32, torch.float64) else torch.float32
    return torch.lerp(pre.to(work), ft.to(work), alpha).to(ft.dtype)


def interpolate(finetuned: Mapping[str, Tensor], pretrained: Mapping[str, Tensor], alpha: float) -> Dict[str, Tensor]:
    """θ_α for every entry of ``finetuned`` (same names, order, shapes and dtypes).

    Entries not interpolated are θ_ft's own tensor objects. Raises ConfigError for α outside [0, 1]
    (naming ``--alpha``) or when no tensor is shared.
    Tensors tied in θ_ft (one storage under two names, e.g. RoBERTa's embeddings and LM head) stay
    tied in θ_α when their pretrained counterparts are tied too.
    """
    alpha = check_alpha(alpha)
    names = shared_names(finetuned, pretrained)
    if not names:
        raise ConfigError("the fine-tuned and the pretrained model share no tensor (by name and shape): "
                          "nothing to interpolate")
    shared, done = set(names), {}
    out = {}
    with torch.no_grad():
        for k, v in finetuned.items():
            if k not in shared:
                out[k] = v
                continue
            pre = pretrained[k]
            key = (v.data_ptr(), v.storage_offset(), v.stride(), tuple(v.shape),
                   pre.data_ptr(), pre.storage_offset(), pre.stride())
            if v.numel() and key in done:
                out[k] = done[key]
                continue
            out[k] = done[key] = _mix(v.detach(), pre.detach(), alpha)
    return out
