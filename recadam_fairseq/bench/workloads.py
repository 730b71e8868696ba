"""The benchmark's workloads: RoBERTa-sized parameter sets in the two layouts fairseq hands an optimizer (one
flat fp32 tensor under --fp16; the model's own shapes), with gradients and θ*."""

import math
import re
from dataclasses import dataclass
from typing import List, Optional

import torch

from recadam_fairseq.core import layer_lr


# (layers, dim, ffn, vocab) of RoBERTa-like encoders.
SIZES = {
    "tiny": (2, 128, 512, 12000),
    "base": (12, 768, 3072, 50265),
    "large": (24, 1024, 4096, 50265),
}
MAX_POSITIONS = 514
NUM_CLASSES = 2
FLAT_HEAD_FRACTION = 0.001  # the unanchored tail of the flat layout (a classifier head)
WORD = 4  # bytes of an fp32 element
LLRD_GAMMA = 0.9


@dataclass
class Workload:
    layout: str
    size: str
    params: List[torch.Tensor]  # fp32, each with .grad set
    anchors: List[Optional[torch.Tensor]]  # fp32 θ* per parameter, None for the unanchored head
    runs: Optional[list]  # anchored element runs of the flat tensor
    numel: int
    anchored: int


def roberta_shapes(layers: int, dim: int, ffn: int, vocab: int):
    """(shape, anchored) of a RoBERTa encoder's tensors, then a 2-layer classification head."""
    shapes = [((vocab, dim), True), ((MAX_POSITIONS, dim), True), ((dim,), True), ((dim,), True)]
    for _ in range(layers):
        for _qkvo in range(4):
            shapes += [((dim, dim), True), ((dim,), True)]
        shapes += [((dim,), True), ((dim,), True)]  # self-attention layer norm
        shapes += [((ffn, dim), True), ((ffn,), True), ((dim, ffn), True), ((dim,), True)]
        shapes += [((dim,), True), ((dim,), True)]  # final layer norm
    shapes += [((dim, dim), False), ((dim,), False), ((NUM_CLASSES, dim), False), ((NUM_CLASSES,), False)]
    return shapes


def roberta_names(layers: int) -> List[str]:
    """The parameter names of ``roberta_shapes``, in its order."""
    enc = "encoder.sentence_encoder."
    names = [enc + n for n in ("embed_tokens.weight", "embed_positions.weight", "layernorm_embedding.weight",
                                 "layernorm_embedding.bias")]
    layer = [f"self_attn.{x}_proj.{y}" for x in ("q", "k", "v", "out") for y in ("weight", "bias")]
    layer += [f"{m}.{y}" for m in ("self_attn_layer_norm", "fc1", "fc2", "final_layer_norm") for y in ("weight", "bias")]
    names += [f"{enc}layers.{i}.{n}" for i in range(layers) for n in layer]
    return names + [f"classification_heads.h.{m}.{y}" for m in ("dense", "out_proj") for y in ("weight", "bias")]


def llrd_scales(w: "Workload", gamma: float = LLRD_GAMMA) -> list:
    """--layer-lr-decay's scale of each workload tensor (flat: element runs per layer), from core/layer_lr.py."""
    layers = SIZES[w.size][0]
    names, shapes = roberta_names(layers), [s for s, _ in roberta_shapes(*SIZES[w.size])]
    scale_of = layer_lr.name_scales(names, gamma, layers)
    if w.layout == "flat":
        parts, off = [], 0
        for n, shape in zip(names, shapes):
            parts.append((n, off, math.prod(shape)))
            off += math.prod(shape)
        return layer_lr.tensor_scales([parts], scale_of)
    return layer_lr.tensor_scales([[(n, 0, math.prod(shape))] for n, shape in zip(names, shapes)], scale_of)


def flat_elements(size: str) -> Optional[int]:
    """``25M`` (a flat tensor of 25 million elements, no model's shapes) -> 25_000_000; a named size -> None."""
    if size in SIZES:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)M", size)
    n = round(float(m.group(1)) * 1e6) if m else 0
    if n < 1:  # 0.0000001M rounds to no element
        raise ValueError(f"size {size!r}: one of {', '.join(SIZES)}, or millions of elements of a flat tensor "
                         f"such as 25M")
    return n


def size_numel(size: str) -> int:
    n = flat_elements(size)
    return n if n is not None else sum(math.prod(s) for s, _ in roberta_shapes(*SIZES[size]))


def random_like_weights(shape, device, gen) -> torch.Tensor:
    return torch.empty(shape, device=device).uniform_(-0.05, 0.05, generator=gen)


def build_workload(layout: str, size: str, device: torch.device, seed: int = 0) -> Workload:
    """Parameters (θ* plus a small drift, so the pull has work), gradients and fp32 anchors."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n = flat_elements(size)
    if n is not None and layout != "flat":
        raise ValueError(f"size {size}: a number of elements has no tensors' shapes; it needs the flat layout")
    shapes = roberta_shapes(*SIZES[size]) if n is None else [((n,), True)]
    if layout == "flat":
        n = sum(math.prod(s) for s, _ in shapes)
        n_anchored = n - max(1, round(n * FLAT_HEAD_FRACTION))
        shapes = [((n,), True)]
    params, anchors = [], []
    for shape, anchored in shapes:
        p = random_like_weights(shape, device, gen)
        p.grad = random_like_weights(shape, device, gen).mul_(0.1)
        anchor = None
        if anchored:
            anchor = (p[:n_anchored] if layout == "flat" else p).detach().clone()
            p.add_(random_like_weights(shape, device, gen), alpha=0.01)
        params.append(p)
        anchors.append(anchor)
    numel = sum(p.numel() for p in params)
    anchored = sum(a.numel() for a in anchors if a is not None)
    runs = [(0, anchored)] if layout == "flat" else None
    return Workload(layout, size, params, anchors, runs, numel, anchored)
