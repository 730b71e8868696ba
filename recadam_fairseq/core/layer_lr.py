"""Layer-wise learning-rate decay (LLRD): each tensor's lr scale from its parameter name.

Pure torch (no fairseq import). With L encoder layers and decay γ (ELECTRA, Clark et al. 2020;
Zhang et al. 2021), encoder layer l (fairseq's 0-based ``sentence_encoder.layers.{l}.``) gets
lr·γ^(L−l) (the top layer γ, the bottom γ^L), the embeddings (token and position embeddings and
their layer norm) lr·γ^(L+1), everything else (classification heads, lm_head's own tensors,
CA-MTL's new modules, wherever they sit) lr.

An encoder–decoder (fairseq's ``transformer*``, ``bart_*``: ``encoder.layers.{l}.``,
``decoder.layers.{l}.``) decays each stack from its own top: encoder layer l gets γ^(E−l), decoder
layer l γ^(D−l), the embeddings (shared or not) γ^(max(E, D)+1). The decoder reads the encoder's
output, but its layers are no more task-specific for that: we do not stack one on the other.

The scales map onto the optimizer's tensors through :func:`anchor.layout` (the model's tensors,
fp32 copies, or ``--fp16``'s one flat tensor, where each parameter is an element run).
"""

import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .anchor import layout, trainable_named_parameters
from .conditional_modules import new_tensor_names
from .errors import ConfigError
from .wrappers import unwrap_model

FLAG = "--layer-lr-decay"
EMBEDDINGS = ("embed_tokens", "embed_positions", "layernorm_embedding", "emb_layer_norm")
# RoBERTa's sentence_encoder.layers.N (the stack "encoder"), an encoder-decoder's encoder/decoder.layers.N
_LAYER = re.compile(r"(?:^|\.)(?:sentence_(encoder)|(encoder|decoder))\.layers\.(\d+)\.")
_EMBEDDING = re.compile(r"(?:^|\.)(?:sentence_encoder|encoder|decoder)\.(?:%s)\." % "|".join(EMBEDDINGS))

# One optimizer tensor's scale: None (1 everywhere), a number, or element runs [(start, length, scale)]
# (elements outside the runs: 1).
Scale = Union[None, float, List[Tuple[int, int, float]]]


def check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:  # NaN fails too
        raise ConfigError(f"{FLAG} {gamma:g}: must be in (0, 1] (1 turns the decay off; ELECTRA uses 0.8, "
                          f"BERT-base fine-tuning 0.9 to 0.95)")


def stack_of(name: str) -> Optional[Tuple[str, int]]:
    """("encoder" or "decoder", the 0-based layer) of parameter ``name``, or None outside the layers."""
    m = _LAYER.search(name)
    return ((m.group(1) or m.group(2)), int(m.group(3))) if m else None


def layer_of(name: str) -> Optional[int]:
    """The layer (0-based, in its stack) parameter ``name`` belongs to, or None outside the layers."""
    found = stack_of(name)
    return found[1] if found else None


def stack_layers(names: Iterable[str]) -> Dict[str, int]:
    """How many layers each stack has, from the parameter names: {"encoder": L} for RoBERTa."""
    out: Dict[str, int] = {}
    for found in map(stack_of, names):
        if found:
            out[found[0]] = max(out.get(found[0], 0), found[1] + 1)
    return out


def num_layers(names: Iterable[str]) -> int:
    """L: how many layers the deepest stack shows (0 when none)."""
    return max(stack_layers(names).values(), default=0)


def exponent(name: str, layers: Union[int, Dict[str, int]], new: Sequence[str] = ()) -> int:
    """k in lr·γ^k for parameter ``name``; ``layers``: the encoder's count, or each stack's."""
    if name in new:
        return 0
    layers = {"encoder": layers} if isinstance(layers, int) else layers
    found = stack_of(name)
    if found:
        return layers[found[0]] - found[1]
    return max(layers.values()) + 1 if _EMBEDDING.search(name) else 0


def name_scales(names: Sequence[str], gamma: float, layers: Union[int, Dict[str, int]],
                new: Sequence[str] = ()) -> Dict[str, float]:
    new = set(new)
    return {n: gamma ** exponent(n, layers, new) for n in names}


def tensor_scales(parts: Sequence[Sequence[Tuple[Optional[str], int, int]]], scale_of: Dict[str, float]) -> List[Scale]:
    """Per optimizer tensor (its parts from :func:`anchor.layout`): None, one scale, or element runs.

    Parts named None (criterion tensors) and names without a scale get 1.
    """
    out: List[Scale] = []
    for tensor_parts in parts:
        runs: List[List] = []
        for name, start, n in tensor_parts:
            s = scale_of.get(name, 1.0) if name is not None else 1.0
            if s == 1.0 or n == 0:
                continue
            if runs and runs[-1][0] + runs[-1][1] == start and runs[-1][2] == s:
                runs[-1][1] += n
            else:
                runs.append([start, n, s])
        total = sum(n for _, _, n in tensor_parts)
        if not runs:
            out.append(None)
        elif len(runs) == 1 and runs[0][0] == 0 and runs[0][1] == total:
            out.append(runs[0][2])
        else:
            out.append([(s, n, x) for s, n, x in runs])
    return out


class LayerLRPlan:
    """The scales of ``tensors`` (the optimizer's) for ``model``'s parameter names and decay ``gamma``."""

    def __init__(self, tensors: Sequence[Tensor], model: torch.nn.Module, gamma: float):
        check_gamma(gamma)
        model = unwrap_model(model)
        named = trainable_named_parameters(model)
        self.gamma = gamma
        # L counts every layer, trainable or frozen
        self.stacks = stack_layers(n for n, _ in model.named_parameters())
        self.layers = max(self.stacks.values(), default=0)
        if self.layers == 0:
            raise ConfigError(f"{FLAG} {gamma:g}: the model has no layers named *.sentence_encoder.layers.N.* "
                              f"(RoBERTa's) or encoder.layers.N / decoder.layers.N (fairseq's encoder-decoders), "
                              f"so there is nothing to decay (model: {', '.join(n for n, _ in named[:3])}, ...)")
        self.new = new_tensor_names(model)
        self.scale_of = name_scales([n for n, _ in named], gamma, self.stacks, self.new)
        self.scales = tensor_scales(layout(tensors, named), self.scale_of)

    def summary(self) -> str:
        """One line: the scale of the embeddings, of each stack's bottom and top layers, and of the rest."""
        g, L = self.gamma, self.layers
        if list(self.stacks) == ["encoder"]:
            return (f"{FLAG} {g:g} over {L} encoder layers: embeddings ×{g ** (L + 1):.3g}, layers 0..{L - 1} "
                    f"×{g ** L:.3g}..×{g:.3g}, the rest (heads, lm_head, new modules) ×1")
        stacks = ", ".join(f"{s} layers 0..{n - 1} ×{g ** n:.3g}..×{g:.3g}" for s, n in self.stacks.items())
        return f"{FLAG} {g:g}: embeddings ×{g ** (L + 1):.3g}, {stacks}, the rest ×1"
