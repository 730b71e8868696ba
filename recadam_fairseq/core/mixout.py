"""Mixout (Lee, Cho, Kang, "Mixout: Effective Regularization to Finetune Large-scale Pretrained Language
Models", ICLR 2020) as a weight parametrization.

In training, a weight W [out, in] with target θ* (the pretrained weight) is used as

    W̃ = ((1 − M)⊙θ* + M⊙W − p·θ*) / (1 − p) = θ* + M⊙(W − θ*) / (1 − p),

M ~ Bernoulli(1 − p) drawn anew at every read of the weight (one read per forward in fairseq). As in
the authors' ``Mixout`` function, M is drawn per input neuron (column j of W: all outgoing parameters
of input neuron j take θ* together, M[i, j] = m[j]), so E[W̃] = W; in evaluation W̃ = W (the tensor
itself). p = 0 is W with no random number drawn; p = 1 (W̃ = θ*, nothing learns) is refused.

The update goes on the weight through ``torch.nn.utils.parametrize`` (fairseq's attention reads
``q_proj.weight`` directly): W is ``<module>.parametrizations.weight.original`` and θ* the
persistent buffer ``<module>.parametrizations.weight.0.target``, so a checkpoint carries its
targets. Pure torch (no fairseq).
"""

from typing import Dict

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from . import parametrized

_PARTS = ("original", "0.target")


def check_p(p: float) -> float:
    """p as a float in [0, 1); ValueError otherwise (nan included)."""
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"mixout probability must be in [0, 1), got {p}")
    return p


def mixout_weight(weight: Tensor, target: Tensor, scale: Tensor) -> Tensor:
    """θ* + scale⊙(W − θ*), scale = M/(1 − p) broadcast over W's rows: THE formula (one lerp, one rounding)."""
    return torch.lerp(target, weight, scale)


class Mixout(nn.Module):
    """The parametrization of one weight [out, in]: ``forward(W) = θ* + M⊙(W − θ*)/(1 − p)`` in training."""

    def __init__(self, target: Tensor, p: float):
        super().__init__()
        self.p = check_p(p)
        self.register_buffer("target", target.detach().clone())

    def draw_scale(self, weight: Tensor) -> Tensor:
        """M/(1 − p) for one read: a [in] vector (the authors' mask, one value per input neuron)."""
        m = torch.empty(weight.shape[-1], dtype=weight.dtype, device=weight.device).bernoulli_(1.0 - self.p)
        return m.div_(1.0 - self.p)

    def forward(self, weight: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return weight
        return mixout_weight(weight, self.target, self.draw_scale(weight))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def add_mixout(linear: nn.Module, p: float) -> Mixout:
    """Parametrize ``linear.weight`` with mixout toward its current value (the target until a load sets it).

    ``unsafe``: torch's registration check would run the forward once, drawing random numbers at build time.
    """
    mod = Mixout(linear.weight, p)
    parametrize.register_parametrization(linear, "weight", mod, unsafe=True)
    return mod


def targets_by_parameter(model: nn.Module) -> Dict[str, Tensor]:
    """{name of the trained W (``...parametrizations.weight.original``): its target θ*} of a model."""
    out = {}
    for name, module in model.named_modules():
        plist = getattr(module, "parametrizations", None)
        if plist is None or not parametrize.is_parametrized(module, "weight"):
            continue
        mods = list(plist["weight"])
        if len(mods) == 1 and isinstance(mods[0], Mixout):
            out[(name + "." if name else "") + "parametrizations.weight.original"] = mods[0].target
    return out


def set_target(model: nn.Module, parameter_name: str, tensor: Tensor) -> None:
    """Make ``tensor`` (same shape, dtype and values) the target of the weight ``parameter_name`` names."""
    module_name = parameter_name[:-len(".original")]  # <module>.parametrizations.weight
    mod = model.get_submodule(module_name)[0]
    old = mod.target
    if tensor.shape != old.shape or tensor.dtype != old.dtype or tensor.device != old.device:
        raise ValueError(f"{parameter_name}: a target of {tuple(tensor.shape)} {tensor.dtype} on {tensor.device} "
                         f"for one of {tuple(old.shape)} {old.dtype} on {old.device}")
    mod.target = tensor


# --------------------------------------------------------------------------- state dicts
def mixout_groups(state: Dict[str, Tensor]) -> Dict[str, Dict[str, str]]:
    """{plain tensor name: {"original": key, "0.target": key}} of the mixout tensors of a state dict.

    A parametrized tensor counts only when its target is there (LoRA's ``original`` has none).
    """
    both = parametrized.groups(state, _PARTS)
    return {plain: parts for plain, parts in both.items() if len(parts) == 2}


def is_mixout_state(state: Dict[str, Tensor]) -> bool:
    """Whether the state dict holds mixout-parametrized tensors."""
    return bool(mixout_groups(state))


def plain_state_dict(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """A mixout state dict under plain names: W (what evaluation uses) as ``<module>.weight``, targets dropped.

    Other entries are passed through (the same tensor objects), in order.
    """
    groups = mixout_groups(state)
    by_key = {parts["original"]: plain for plain, parts in groups.items()}
    drop = {parts["0.target"] for parts in groups.values()}
    return {by_key.get(k, k): v for k, v in state.items() if k not in drop}


# --------------------------------------------------------------------------- storage accounting
def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one storage counted once)."""
    seen = {}
    for t in tensors:
        if t is not None and t.numel():
            s = t.untyped_storage()
            seen[(t.device, s.data_ptr())] = s.nbytes()
    return sum(seen.values())
