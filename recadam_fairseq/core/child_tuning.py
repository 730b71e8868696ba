"""ChildTuning: only a "child network" of the weights takes the task gradient (pure torch; no fairseq import).

Xu et al., "Raise a Child in Large Language Model: Towards Effective and Generalizable Fine-tuning",
EMNLP 2021 (the authors' ``ChildTuningAdamW`` and ``ChildTuningD.py`` in alibaba/AliceMind):

- ChildTuning-F (task-free): every update keeps each gradient element of every parameter with
  probability p (a fresh Bernoulli(p) mask) and scales the kept ones by 1/p.
- ChildTuning-D (task-driven): before the first update, the empirical Fisher information of the
  training data, Σ over batches of g² (each tensor's batch gradient clipped to the training's clip
  norm, as the authors do), ranks the elements of the encoder layers; the top p fraction of them
  takes the gradient for the whole run, the other encoder-layer elements none. Parameters outside
  the encoder layers (embeddings, heads) are not masked. No rescaling.

Both masks multiply the gradient before Adam's moments; the fairseq adapter (``optim/child_tuning.py``)
applies them to the optimizer's tensors just before the step.
"""

import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .errors import ConfigError
from .layer_lr import layer_of
from .sam import accumulation_dtype, fisher_mask

MODES = ("off", "F", "D")
FLAG, RATIO_FLAG, BATCHES_FLAG = "--child-tuning", "--child-tuning-ratio", "--child-tuning-fisher-batches"
CHUNK = 1 << 22  # F draws at most this many uniforms at once: a bounded temporary
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s, which the authors call on each tensor
_SALT = 0x43_68_69_6C_64  # "Child": F's draws are a stream of their own, apart from fairseq's seed + update


def check(mode: str, ratio: float, fisher_batches) -> None:
    """ConfigError naming the flag of a value outside its range."""
    if str(mode) not in MODES:
        raise ConfigError(f"{FLAG} {mode!r}: choose one of {', '.join(MODES)}")
    if not 0.0 < ratio <= 1.0:  # NaN fails too
        raise ConfigError(f"{RATIO_FLAG} {ratio:g}: must be in (0, 1], the fraction of gradient elements kept "
                          f"(the authors use 0.1 to 0.3 for D, 0.2 to 0.4 for F; 1 keeps all)")
    if not (float(fisher_batches).is_integer() and fisher_batches >= 0):
        raise ConfigError(f"{BATCHES_FLAG} {fisher_batches}: must be an integer >= 0 (0: one pass over the "
                          f"whole training set, as the authors)")


def d_eligible(name: str) -> bool:
    """The parameters ChildTuning-D masks: those of the encoder layers (the authors' ``'layer' in name``
    for BERT's ``encoder.layer.N.``; here fairseq's ``sentence_encoder.layers.N.``)."""
    return layer_of(name) is not None


# --------------------------------------------------------------------------- F: a Bernoulli(p) mask per update
def draw_seed(seed: int, update: int) -> int:
    """The seed of update ``update``'s mask: a function of (seed, update) only, the same on every rank."""
    a, b = np.random.SeedSequence([_SALT, int(seed) & 0xFFFFFFFF, int(update)]).generate_state(2)
    return ((int(a) << 32) | int(b)) & ((1 << 63) - 1)


def mask_f_(parts: Sequence[Tuple[Optional[Tensor], int]], p: float, generator: torch.Generator) -> None:
    """In place: for each part (a 1-D gradient view or None, its length), in order, draw that many
    uniforms u in [0, 1) from ``generator`` and zero the gradient where u >= p (kept with probability p).

    A part without a gradient still draws, so the draws depend only on the sequence of lengths: the
    model's parameters in order, whether they are separate tensors or runs of one flat tensor. The 1/p
    is not applied here (the adapter folds it into the step's gradient scale).
    """
    for g, n in parts:
        for s in range(0, n, CHUNK):
            m = min(CHUNK, n - s)
            u = torch.rand(m, generator=generator, device=generator.device, dtype=torch.float32)
            if g is not None:
                g[s:s + m].masked_fill_(u >= p, 0)


# --------------------------------------------------------------------------- D: the Fisher mask
class FisherSum:
    """Σ over batches of each tensor's squared batch gradient, in at least fp32; each tensor's gradient is
    first clipped to norm ``clip`` (> 0; torch's ``clip_grad_norm_`` on that tensor alone)."""

    def __init__(self, params: Sequence[Tensor], clip: float = 0.0):
        self.sums = [torch.zeros_like(p, dtype=accumulation_dtype(p)) for p in params]
        self.clip = float(clip)
        self.batches = 0

    @torch.no_grad()
    def add(self, grads: Sequence[Optional[Tensor]], scale: float = 1.0, check_finite: bool = False) -> bool:
        """Add one batch's gradients, computed on the loss × ``scale`` (fp16's loss scale; removed here).

        With ``check_finite``, nothing is added and False is returned when a gradient is inf/NaN.
        """
        gs = [None if g is None else g.to(s.dtype) / scale for g, s in zip(grads, self.sums)]
        live = [(g, s) for g, s in zip(gs, self.sums) if g is not None]
        if check_finite and live and not bool(torch.stack([torch.isfinite(g).all() for g, _ in live]).all()):
            return False
        for g, s in live:
            if self.clip > 0:
                coef = self.clip / (torch.linalg.vector_norm(g) + CLIP_EPS)
                g.mul_(coef.clamp(max=1.0))
            s.addcmul_(g, g)
        self.batches += 1
        return True


def kept_count(n: int, ratio: float) -> int:
    """How many of n elements ChildTuning-D keeps: max(1, ⌊ratio·n⌋), as FSAM's Fisher mask."""
    return max(1, int(n * ratio))


def d_mask(fisher: Sequence[Tensor], ratio: float) -> List[Tensor]:
    """Bool keep masks: the exact top ``kept_count(N, ratio)`` of the N elements of ``fisher`` together;
    ties at the threshold go to the earliest elements (tensor order, then row-major)."""
    if not all(bool(torch.isfinite(f).all()) for f in fisher):
        raise FloatingPointError(f"{FLAG} D: the Fisher information is not finite (the loss or its gradient "
                                 f"overflowed on the training data)")
    return fisher_mask(list(fisher), ratio)


# --------------------------------------------------------------------------- the mask in a checkpoint
_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_bits(mask: Tensor) -> Tensor:
    """A bool tensor as uint8, 8 elements a byte (row-major, the first element in the high bit)."""
    flat = mask.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return (flat.view(-1, 8) * _BITS.to(flat.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, shape: Sequence[int]) -> Tensor:
    """The bool tensor of ``shape`` that :func:`pack_bits` packed."""
    n = int(np.prod(shape, dtype=np.int64))
    if packed.numel() != (n + 7) // 8:
        raise ValueError(f"{packed.numel()} packed bytes do not hold {n} elements")
    bits = (packed.reshape(-1, 1) & _BITS.to(packed.device)) != 0
    return bits.reshape(-1)[:n].reshape(tuple(shape))


def checksum(packed: Sequence[Tensor]) -> int:
    """CRC-32 of the packed masks, in order (for the log: equal masks on every rank, every resume)."""
    crc = 0
    for t in packed:
        crc = zlib.crc32(t.detach().cpu().contiguous().numpy().tobytes(), crc)
    return crc
