"""EWC (Kirkpatrick et al., PNAS 2017): the pull toward θ* weighted per element by a diagonal Fisher F.

Pure torch (no fairseq import). RecAdam is EWC with F ≡ 1; here F is

- accumulated from per-example gradients g_i at θ* (:class:`FisherSum`: the empirical Fisher
  (1/N)·Σ_i g_i², with the examples' own labels),
- checked against the model (:func:`check`: names, shapes, finite, >= 0; one line each),
- normalised to mean 1 over the anchored elements (:func:`normalise`), so that γ
  (``--recadam-pretrain-cof``) keeps RecAdam's meaning: the average element is pulled as hard as
  RecAdam pulls every element,
- used by the optimizer (``RecAdam.set_fisher``: decoupled, each element's pull weight capped at 1)
  or in the loss (:func:`penalty`: coupled, ½·γ·Σ F·(θ−θ*)²).

A Fisher file (``scripts/fisher.py``) is a ``torch.save``d dict {"fisher": {name: F}, "examples": N,
"source": text}; F is stored un-normalised (the mean of g²), as computed.
"""

import math
import os
from typing import Container, Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import checkpoint_file
from .errors import ConfigError

FLAG = "--ewc-fisher"
TASK = "task"  # --ewc-fisher task: the target task's empirical Fisher at θ*, before update 1


class FisherSum:
    """Σ_i g_i² over examples, in float64 when the parameters are float64, else fp32 (per-example gradients
    are small: their squares are summed in at least fp32)."""

    def __init__(self, params: Sequence[Tensor]):
        self.sums = [torch.zeros_like(p, dtype=torch.float64 if p.dtype == torch.float64 else torch.float32)
                     for p in params]
        self.examples = 0

    @torch.no_grad()
    def add(self, grads: Sequence[Optional[Tensor]], scale: float = 1.0) -> bool:
        """Add one example's gradients of its loss × ``scale`` (an fp16 loss scale, removed here).
        Nothing is added and False is returned when one is inf/NaN (the caller lowers the scale)."""
        gs = [None if g is None else g.to(s.dtype) / scale for g, s in zip(grads, self.sums)]
        live = [(g, s) for g, s in zip(gs, self.sums) if g is not None]
        if live and not bool(torch.stack([torch.isfinite(g).all() for g, _ in live]).all()):
            return False
        for g, s in live:
            s.addcmul_(g, g)
        self.examples += 1
        return True

    def mean(self) -> list:
        return [s / max(self.examples, 1) for s in self.sums]


def check(fisher: Dict[str, Tensor], shapes: Dict[str, tuple], anchored: Iterable[str], where: str) -> None:
    """ConfigError (one line, naming ``where``: the flag and file) when F does not fit the model: a name the
    model lacks, another shape, an anchored parameter without F, a non-finite or negative value."""
    for n, f in fisher.items():
        if n not in shapes:
            raise ConfigError(f"{where}: parameter {n} is not in the model (another model's Fisher?)")
        if not torch.is_tensor(f) or not f.is_floating_point():
            raise ConfigError(f"{where}: F of {n} is not a floating-point tensor")
        if tuple(f.shape) != tuple(shapes[n]):
            raise ConfigError(f"{where}: F of {n} has shape {tuple(f.shape)}, the model's parameter {tuple(shapes[n])}")
        if not bool(torch.isfinite(f).all()):
            raise ConfigError(f"{where}: F of {n} holds {int((~torch.isfinite(f)).sum())} NaN or Inf value(s)")
        if bool((f < 0).any()):
            raise ConfigError(f"{where}: F of {n} holds {int((f < 0).sum())} negative value(s): a Fisher is >= 0")
    missing = [n for n in anchored if n not in fisher]
    if missing:
        more = f", ... ({len(missing)} in all)" if len(missing) > 3 else ""
        raise ConfigError(f"{where}: no F for the pretrained parameter(s) {', '.join(missing[:3])}{more}")


def normalise(fisher: Dict[str, Tensor], names: Sequence[str], where: str,
              keep: Optional[Container[str]] = None) -> Tuple[Dict[str, Tensor], float]:
    """F / mean(F) over the elements of ``names`` (the anchored ones): mean F = 1 there, in fp32 (float64
    sum). Returns (the normalised F of ``names``, or of those also in ``keep`` (a rank's shard), the mean
    divided by). All zeros: ConfigError."""
    total = sum(float(fisher[n].double().sum()) for n in names)
    count = sum(fisher[n].numel() for n in names)
    mean = total / max(count, 1)
    if not (mean > 0 and math.isfinite(mean)):
        raise ConfigError(f"{where}: F is zero on every pretrained element (mean {mean:g}): nothing to weigh the "
                          f"pull with (no examples, or a loss without gradient?)")
    kept = names if keep is None else [n for n in names if n in keep]
    return {n: (fisher[n].double() / mean).float() for n in kept}, mean


def penalty(pairs: Sequence[Tuple[Tensor, Tensor, Optional[Tensor]]]) -> Tensor:
    """Σ F·(θ−θ*)² over (θ, θ*, F or None) in fp32; F None is F ≡ 1, the plain Σ(θ−θ*)² exactly."""
    return sum(((p.float() - a.float()) ** 2 if f is None else f.float() * (p.float() - a.float()) ** 2).sum()
               for p, a, f in pairs)


def save(path: str, fisher: Dict[str, Tensor], examples: int, source: str) -> None:
    torch.save({"fisher": {n: f.detach().float().cpu() for n, f in fisher.items()}, "examples": int(examples),
                "source": source}, path)


def load(path: str, mmap: bool = False, what: str = "") -> Tuple[Dict[str, Tensor], str]:
    """A Fisher file's {name: F} and a line saying what it holds; ConfigError naming ``what`` (the flag and file).
    ``mmap``: the tensors memory-mapped (a check of the file), not read."""
    where = what or f"{FLAG} {path}"
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file (write one with scripts/fisher.py, or use {FLAG} {TASK})")
    st = checkpoint_file.load(path, where, mmap=mmap)  # refused, cut short, not torch's: one line
    if not isinstance(st, dict) or not isinstance(st.get("fisher"), dict) or not st["fisher"]:
        raise ConfigError(f"{where}: not a Fisher file (scripts/fisher.py writes a dict with a non-empty 'fisher')")
    return dict(st["fisher"]), f"{where} ({st.get('examples', '?')} examples, {st.get('source', '?')})"
