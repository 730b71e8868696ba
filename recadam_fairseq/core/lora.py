"""LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) as a weight parametrization.

A frozen weight W [out, in] is used as W' = W + (B @ A) · s, s = α / r, with A [r, in] drawn as
loralib draws it (kaiming_uniform_, a = √5) and B [out, r] zero, so a fresh LoRA model computes
exactly the pretrained function. The update goes on the weight, not on the activations, through
``torch.nn.utils.parametrize``: every reader of ``linear.weight`` sees W' (fairseq's attention
passes ``q_proj.weight`` straight to ``F.multi_head_attention_forward``, bypassing the Linear's
forward).

Parametrize stores W as ``<module>.parametrizations.weight.original`` and this module's tensors as
``<module>.parametrizations.weight.0.{lora_A,lora_B,scaling}``; ``scaling`` (s, a buffer in the
weights' dtype) makes a state dict self-contained: ``merged_state_dict`` turns it back into plain
names with W' computed by the same function as the forward, so merged and unmerged agree bit for bit.
Pure torch (no fairseq).
"""

import math
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from . import parametrized
from .errors import ConfigError

# --lora-modules names -> the Linear inside a fairseq TransformerEncoderLayer
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "out": "self_attn.out_proj", "fc1": "fc1", "fc2": "fc2"}

_PARTS = ("original", "0.lora_A", "0.lora_B", "0.scaling")


def parse_modules(spec: str, flag: str = "--lora-modules") -> List[str]:
    """The module names of a comma-separated list (order kept, repeats dropped); ConfigError naming ``flag``."""
    names = [s.strip().lower() for s in str(spec or "").split(",") if s.strip()]
    bad = [n for n in names if n not in MODULES]
    if bad or not names:
        raise ConfigError(f"{flag} {spec!r}: " + (f"unknown module {bad[0]!r}" if bad else "names no module")
                          + f"; choose from {','.join(MODULES)} (comma-separated)")
    return list(dict.fromkeys(names))


def lora_weight(weight: Tensor, lora_A: Tensor, lora_B: Tensor, scaling: Tensor) -> Tensor:
    """W + (B @ A) · s: THE formula, used by the forward and by ``merged_state_dict``."""
    return weight + (lora_B @ lora_A) * scaling


class LoRA(nn.Module):
    """The parametrization of one weight [out, in]: ``forward(W) = W + (B @ A) · α/r``."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        if rank < 1 or alpha <= 0:
            raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got rank {rank}, alpha {alpha}")
        self.rank, self.alpha = rank, alpha
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.empty(out_features, rank, dtype=dtype, device=device))
        self.register_buffer("scaling", torch.tensor(alpha / rank, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """loralib's init: A ~ kaiming_uniform_(a=√5) (U(±1/√in)), B = 0."""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, weight: Tensor) -> Tensor:
        return lora_weight(weight, self.lora_A, self.lora_B, self.scaling)


def add_lora(linear: nn.Module, rank: int, alpha: float) -> LoRA:
    """Parametrize ``linear.weight`` with a fresh LoRA; W is frozen (requires_grad False)."""
    w = linear.weight
    mod = LoRA(w.shape[0], w.shape[1], rank, alpha, dtype=w.dtype, device=w.device)
    parametrize.register_parametrization(linear, "weight", mod)
    linear.parametrizations.weight.original.requires_grad_(False)
    return mod


# --------------------------------------------------------------------------- state dicts
def lora_groups(state: Dict[str, Tensor]) -> Dict[str, Dict[str, str]]:
    """{plain tensor name: {part: key}} of the LoRA-parametrized tensors of a state dict.

    part is ``original``, ``0.lora_A``, ``0.lora_B``, ``0.scaling``; raises ValueError when one is missing.
    An ``original`` without any LoRA part is another parametrization's (mixout's), not LoRA's.
    """
    groups = {plain: parts for plain, parts in parametrized.groups(state, _PARTS).items() if set(parts) != {"original"}}
    for plain, parts in groups.items():
        missing = [p for p in _PARTS if p not in parts]
        if missing:
            raise ValueError(f"{plain}: a LoRA parametrization without its {missing[0]} tensor")
    return groups


def is_lora_state(state: Dict[str, Tensor]) -> bool:
    """Whether the state dict holds LoRA-parametrized tensors."""
    return any(set(parts) != {"original"} for parts in parametrized.groups(state, _PARTS).values())


def lora_scaling(state: Dict[str, Tensor]) -> Optional[float]:
    """s = α/r stored in a LoRA state dict (None: not a LoRA one); ValueError if its tensors disagree."""
    values = {float(state[g["0.scaling"]]) for g in lora_groups(state).values()}
    if len(values) > 1:
        raise ValueError(f"LoRA tensors with different scalings: {sorted(values)}")
    return values.pop() if values else None


def merged_state_dict(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """A LoRA state dict under plain names, each W' = W + (B @ A) · s computed as the forward computes it.

    Other entries are passed through (the same tensor objects); a state dict without LoRA comes back
    as an equal dict. The merged weight takes the place of ``...original`` in the key order.
    """
    groups = lora_groups(state)
    by_key = {parts["original"]: plain for plain, parts in groups.items()}
    drop = {parts[p] for parts in groups.values() for p in _PARTS[1:]}
    out: Dict[str, Tensor] = {}
    for k, v in state.items():
        if k in by_key:
            parts = groups[by_key[k]]
            with torch.no_grad():
                out[by_key[k]] = lora_weight(v, state[parts["0.lora_A"]], state[parts["0.lora_B"]],
                                             state[parts["0.scaling"]])
        elif k not in drop:
            out[k] = v
    return out
