"""θ* in the layout of an FSDP flat parameter shard: which elements of a rank's shard are which parameter's.

fairscale's FullyShardedDataParallel (``flatten_parameters``, fairseq's default) puts a module's
parameters back to back in one flat tensor (its metadata: their names and numels, in that order),
splits it with ``torch.chunk`` into ``world_size`` pieces and pads each rank's piece with zeros to the
first piece's length (``_get_shard``): that padded piece is what the rank's optimizer updates.
A piece may start or end inside a parameter, and the last ranks' pieces may be short or empty.

Pure index math and torch (no fairscale, no fairseq): the adapter reads the metadata.
"""

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .anchor import runs_of
from .errors import ConfigError

# (parameter name, or None for the shard's padding; first element in the shard; numel; first element
# in the parameter's flattened elements)
Part = Tuple[Optional[str], int, int, int]


def shard_range(total: int, world_size: int, rank: int) -> Tuple[int, int, int]:
    """(first, end) of the flat tensor's elements that ``rank`` holds, and the padded shard's length."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}")
    size = -(-total // world_size)  # torch.chunk's piece: ceil(total / world_size)
    first = min(rank * size, total)
    return first, min(first + size, total), size


def shard_parts(names: Sequence[str], numels: Sequence[int], world_size: int, rank: int) -> List[Part]:
    """The parts of ``rank``'s padded shard of the flat tensor of parameters ``names`` (``numels`` each)."""
    if len(names) != len(numels):
        raise ValueError(f"{len(names)} names for {len(numels)} numels")
    first, end, size = shard_range(sum(numels), world_size, rank)
    parts: List[Part] = []
    off = 0
    for name, n in zip(names, numels):
        lo, hi = max(off, first), min(off + n, end)
        if lo < hi:
            parts.append((name, lo - first, hi - lo, lo - off))
        off += n
    if end - first < size:
        parts.append((None, end - first, size - (end - first), 0))
    return parts


def anchored_runs(parts: Iterable[Part], anchored: Iterable[str]) -> List[Tuple[int, int]]:
    """The anchored parts of a shard merged into maximal (start, numel) runs (RecAdam's ``anchor_runs``)."""
    return runs_of([(name, start, n) for name, start, n, _ in parts], anchored)


def check_shapes(numels: Dict[str, int], pretrained: Dict[str, Tensor]) -> List[str]:
    """The names both hold (the anchored ones), after checking their sizes agree."""
    common = [n for n in numels if n in pretrained]
    for n in common:
        if pretrained[n].numel() != numels[n]:
            raise ConfigError(f"parameter {n} has {pretrained[n].numel()} elements in the pretrained checkpoint "
                              f"but {numels[n]} in the model")
    return common


def shard_anchor(shard: Tensor, parts: Sequence[Part], anchored: Iterable[str],
                 values: Optional[Dict[str, Tensor]] = None, dtype: Optional[torch.dtype] = None):
    """(anchor or None, runs or None) of one shard, for ``RecAdam.set_anchor``.

    ``values``: {name: the whole pretrained tensor}; None snapshots the shard itself (the weights the
    model loaded). Runs None: the anchor covers the whole shard (and has its shape).
    """
    runs = anchored_runs(parts, anchored)
    if not runs:
        return None, None
    if sum(n for _, _, n, _ in parts) != shard.numel():
        raise ValueError(f"parts of {sum(n for _, _, n, _ in parts)} elements for a shard of {shard.numel()}")
    anchored = set(anchored)
    flat = shard.detach().reshape(-1)
    buf = torch.empty(sum(n for _, n in runs), dtype=dtype or shard.dtype, device=shard.device)
    off = 0
    for name, start, n, at in parts:
        if name in anchored:
            buf[off:off + n].copy_(flat[start:start + n] if values is None else values[name].reshape(-1)[at:at + n])
            off += n
    if runs == [(0, shard.numel())]:
        return buf.view_as(shard), None
    return buf, runs


# fairscale consolidates a shard's optimizer state (fairseq's save) by all-gathering every state tensor at the
# shard's size and unflattening it per parameter, and re-shards it on load the same way. θ* is kept there
# shard-sized with NaN at the elements that are not anchored (θ* itself is checked finite): per parameter
# after consolidation, a new head's anchor is all NaN.
def marked(anchor: Optional[Tensor], runs: Optional[Sequence[Tuple[int, int]]], numel: int,
           dtype: torch.dtype) -> Tensor:
    """A shard's anchor (RecAdam's layout: runs, or None for the whole shard) as a shard-sized tensor."""
    out = torch.full((numel,), float("nan"), dtype=anchor.dtype if anchor is not None else dtype,
                     device=anchor.device if anchor is not None else None)
    if anchor is None:
        return out
    flat, off = anchor.reshape(-1), 0
    for s, n in runs or [(0, numel)]:
        out[s:s + n] = flat[off:off + n]
        off += n
    return out


def unmarked(x: Tensor):
    """The inverse of :func:`marked`: (anchor or None, runs or None) in RecAdam's layout."""
    flat = x.reshape(-1)
    keep = ~torch.isnan(flat)
    if bool(keep.all()):
        return x, None
    edges = torch.diff(torch.cat([keep.new_zeros(1), keep, keep.new_zeros(1)]).to(torch.int8)).nonzero().reshape(-1)
    runs = [(int(s), int(e - s)) for s, e in zip(edges[0::2].tolist(), edges[1::2].tolist())]
    if not runs:
        return None, None
    return torch.cat([flat[s:s + n] for s, n in runs]), runs
