"""The architecture a fairseq checkpoint was trained with, as the fairseq-train flags that build it again: read
by the task scripts (recadam_fairseq/launch: ARCH unset) and scripts/fisher.py (no --arch), so a command on
another model needs no architecture flags, and a wrong ``--arch`` is one line, not a size-mismatch traceback."""

import argparse
from typing import Dict, List, Optional, Tuple

# What makes two RoBERTa encoders different shapes, or functions: fairseq-train flags read from the checkpoint
SIZE_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
             "activation_fn", "layer_norm_eps")
# the plug-in's models' flags (a converted BERT's 1e-12): said only to an arch that takes them
PLUGIN_KEYS = ("layer_norm_eps",)
# ... and two encoder-decoders (transformer*, bart_*); a boolean is its flag when on and off by default
SEQ2SEQ_SIZE_KEYS = SIZE_KEYS + (
    "decoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads", "max_source_positions",
    "max_target_positions", "encoder_normalize_before", "decoder_normalize_before", "share_all_embeddings",
    "share_decoder_input_output_embed", "layernorm_embedding", "no_scale_embedding")


class ArchError(ValueError):
    """The checkpoint cannot say its architecture, or the one given does not build its tensors."""


def model_config(state: dict) -> dict:
    """The model's arguments: cfg.model (fairseq >= 0.10) or the legacy args namespace."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if model is None:
        model = state.get("args")
    if model is None:
        return {}
    return dict(model) if isinstance(model, dict) else vars(model)


def arch_defaults(arch: str) -> dict:
    """The sizes fairseq's --arch ARCH sets when the flags do not."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    import recadam_fairseq

    recadam_fairseq.register()  # ca_mtl_roberta_*, roberta_ft_* archs
    if arch not in ARCH_CONFIG_REGISTRY:
        return {}
    ns = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](ns)
    return vars(ns)


def arch_flags(m: dict, what: str, keys=SIZE_KEYS) -> Tuple[str, List[str]]:
    """(the arch, the size flags that differ from its defaults) of a model config ``m`` (:func:`model_config`)."""
    arch = m.get("arch") or m.get("_name")
    if not arch:
        raise ArchError(f"{what}: the checkpoint does not say its architecture (no cfg.model.arch)")
    defaults = arch_defaults(arch)
    flags = []
    for k in keys:
        if k not in m or m[k] is None or str(m[k]) == str(defaults.get(k)) or (k in PLUGIN_KEYS and k not in defaults):
            continue
        if isinstance(m[k], bool):  # a store_true flag: only its being on can be said
            flags += [f"--{k.replace('_', '-')}"] if m[k] and not defaults.get(k) else []
        else:
            flags += [f"--{k.replace('_', '-')}", str(m[k])]
    return arch, flags


def max_positions(m: dict) -> int:
    return int(m.get("max_positions") or m.get("tokens_per_sample") or 512)


def mismatch(m: dict, given: str, what: str, flag: str, unset: str) -> Optional[str]:
    """Why ``given`` (an --arch) cannot load the checkpoint of model config ``m``, or None: its layers or width
    differ, or its LayerNorm eps (a converted BERT's 1e-12 would silently become fairseq's 1e-5). ``flag``: how the
    user gave it (ARCH=, --arch ); ``unset``: how to take the checkpoint's instead."""
    from recadam_fairseq.models.layer_norm_eps import FAIRSEQ_EPS

    want = arch_defaults(given)
    size = [(want.get(k), m.get(k)) for k in ("encoder_layers", "encoder_embed_dim")]
    eps = (float(want.get("layer_norm_eps") or FAIRSEQ_EPS), float(m.get("layer_norm_eps") or FAIRSEQ_EPS))
    if any(w is not None and h is not None and int(w) != int(h) for w, h in size):
        (wl, hl), (wd, hd) = size
        why = f"builds {wl} layers of width {wd}, but {what} holds {hl} layers of width {hd}"
    elif eps[0] != eps[1]:
        why = f"builds LayerNorms of eps {eps[0]:g}, but {what} holds a model of eps {eps[1]:g}"
    else:
        return None
    arch, flags = arch_flags(m, what)
    return f"{flag}{given} {why}: {unset} to take the checkpoint's ({arch} {' '.join(flags)}".rstrip() + ")"


def size_flags(state: dict, what: str) -> Dict[str, object]:
    """arch, flags (seq2seq sizes for an encoder-decoder), max positions and layers of a checkpoint's model."""
    m = model_config(state)
    seq2seq = "decoder_layers" in m or "decoder_embed_dim" in m
    arch, flags = arch_flags(m, what, SEQ2SEQ_SIZE_KEYS if seq2seq else SIZE_KEYS)
    return {"arch": arch, "flags": flags, "max_positions": max_positions(m), "seq2seq": seq2seq,
            "layers": int(m.get("encoder_layers") or arch_defaults(arch).get("encoder_layers") or 0)}
