"""fairscale's FSDP (``--ddp-backend fully_sharded``): the parts of each flat parameter shard, from its metadata.

The optimizer of an FSDP rank holds one padded shard of each FSDP instance's flat parameter
(``core/flat_shards.py`` says which elements are whose). The names come from FSDP's own metadata
(``FlatParameter.metadata()``), under the prefix of the instance's module, without the wrappers'
own name components, as fairscale's state dict names them. In the optimizer state θ* is kept shard-sized
(``consolidatable_state``): what fairscale's consolidation at fairseq's save gathers and re-shards.
Not wired into ``--optimizer recadam`` yet (its refusal in ``fairseq_recadam.check_sharding`` says why).
"""

from typing import Dict, List, Optional, Sequence

import torch

from ..core import flat_shards
from ..core.errors import ConfigError

WRAPPER_NAMES = ("_fsdp_wrapped_module", "_fpw_module")  # fairscale's FSDP and FlattenParamsWrapper


def clean_name(name: str) -> str:
    return ".".join(x for x in name.split(".") if x not in WRAPPER_NAMES)


def flat_layouts(model: torch.nn.Module, tensors: Sequence[torch.Tensor]):
    """For each optimizer tensor (a flat parameter shard of an FSDP instance in ``model``): the names and
    numels of its flat parameter's parameters (FSDP's metadata), its FSDP's world size and rank."""
    from fairscale.nn.data_parallel import FullyShardedDataParallel

    owners: Dict[int, tuple] = {}
    for prefix, m in model.named_modules():
        if isinstance(m, FullyShardedDataParallel):
            for p in m.params:
                owners[id(p)] = (clean_name(prefix), m)
    out = []
    for t in tensors:
        owner = owners.get(id(t))
        if owner is None or not hasattr(t, "metadata"):  # --not-fsdp-flatten-parameters, or not FSDP's
            raise ConfigError("recadam --ddp-backend fully_sharded: θ* follows FSDP's flat parameters only; "
                              "drop --not-fsdp-flatten-parameters")
        prefix, m = owner
        names, _, numels = t.metadata()
        out.append(([".".join(x for x in (prefix, clean_name(n)) if x) for n in names], list(numels),
                    m.world_size, m.rank))
    return out


def shard_parts(model: torch.nn.Module, tensors: Sequence[torch.Tensor]) -> List[List[flat_shards.Part]]:
    """For each optimizer tensor, the parts of its shard (``core.flat_shards.shard_parts``)."""
    out = []
    for t, (names, numels, world, rank) in zip(tensors, flat_layouts(model, tensors)):
        parts = flat_shards.shard_parts(names, numels, world, rank)
        if sum(n for _, _, n, _ in parts) != t.numel():
            raise ConfigError(f"recadam --ddp-backend fully_sharded: a shard of {t.numel()} elements, not the "
                              f"{sum(n for _, _, n, _ in parts)} its metadata gives")
        out.append(parts)
    return out


def build_anchors(model: torch.nn.Module, tensors: Sequence[torch.Tensor], pretrained: Dict[str, torch.Tensor],
                  from_file: bool, dtype: Optional[torch.dtype] = None):
    """[(tensor, anchor or None, runs or None)] for FSDP's shards. ``pretrained``: the checkpoint's model
    state under the model's names (``core.anchor.pretrained_names``); anchored are the parameters it
    holds, as unsharded; ``from_file`` False: θ* is a snapshot of the loaded weights (the shard itself)."""
    numels = {n: k for names, counts, _, _ in flat_layouts(model, tensors) for n, k in zip(names, counts)}
    anchored = flat_shards.check_shapes(numels, pretrained)
    return [(t, *flat_shards.shard_anchor(t, parts, anchored, pretrained if from_file else None, dtype))
            for t, parts in zip(tensors, shard_parts(model, tensors))]


def consolidatable_state(opt, anchored: bool) -> dict:
    """``opt.state_dict()`` with each shard's θ* shard-sized, NaN where not anchored (``core.flat_shards.marked``):
    what fairscale's gather_full_optim_state_dict can consolidate. ``anchored``: θ* is in use (anneal_w > 0);
    then every shard has the entry, also one without an anchored element (the ranks' keys must agree)."""
    sd = opt.state_dict()
    params = [p for g in opt.param_groups for p in g["params"]]
    sd["state"] = {i: dict(st) for i, st in sd["state"].items()}  # torch packs the live per-tensor dicts
    for i, st in sd["state"].items():
        if "fisher" in st:
            raise ConfigError("--ewc-fisher does not support --ddp-backend fully_sharded yet: drop one of them")
        runs = st.pop("anchor_runs", None)
        if anchored:
            st["anchor"] = flat_shards.marked(st.get("anchor"), runs, params[i].numel(), params[i].dtype)
    return sd


def restored_state(state_dict: dict) -> dict:
    """The inverse, on a shard's state (fairscale's get_shard_from_optim_state_dict) or the consolidated one
    (per parameter: a new head's θ* is all NaN, i.e. none), in RecAdam's layout."""
    sd = dict(state_dict)
    sd["state"] = {}
    for i, st in state_dict["state"].items():
        st = dict(st)
        if "anchor" in st:
            anchor, runs = flat_shards.unmarked(st.pop("anchor"))
            if anchor is not None:
                st["anchor"] = anchor
                if runs is not None:
                    st["anchor_runs"] = runs
        sd["state"][i] = st
    return sd
