"""Merge a LoRA checkpoint (``--arch roberta_ft_* --lora-rank R``) into a plain fairseq RoBERTa checkpoint.

  python scripts/merge_lora.py CHECKPOINT OUT

Every LoRA weight becomes W + B·A·α/r under RoBERTa's own name (computed as the model's forward
computes it, so the merged model gives the same outputs), A, B and the scalings are dropped, the
arch becomes fairseq's (``roberta_ft_base`` -> ``roberta_base``, ``roberta_ft_large`` ->
``roberta_large``, ``roberta_ft`` / ``roberta_ft_tiny`` -> ``roberta`` with the sizes kept) and the
optimizer state is left out. The result loads without the plug-in (fairseq-validate, hub
``from_pretrained``, ``--restore-file ... --reset-optimizer``), but for a model with another LayerNorm eps than
fairseq's (``--layer-norm-eps``, a converted BERT's): it stays ``roberta_ft``, which computes with it.
"""

import argparse
import os
import sys

FT_FLAGS = ("reinit_layers", "lora_rank", "lora_alpha", "lora_modules")


def plain_arch(arch: str) -> str:
    out = arch.replace("roberta_ft", "roberta", 1)
    return "roberta" if out == "roberta_tiny" else out


def _plain_model_args(ns) -> None:
    """The checkpoint's model namespace, in place: fairseq's RoBERTa arch, no roberta_ft flags (with another
    LayerNorm eps than fairseq's, roberta_ft's arch and eps: only it computes with that eps)."""
    from recadam_fairseq.models.layer_norm_eps import FAIRSEQ_EPS

    if ns is None:
        return
    eps = getattr(ns, "layer_norm_eps", None)
    keep = eps is not None and float(eps) != FAIRSEQ_EPS
    if not keep:
        for key in ("arch", "_name"):
            if isinstance(getattr(ns, key, None), str) and getattr(ns, key).startswith("roberta_ft"):
                setattr(ns, key, plain_arch(getattr(ns, key)))
    for key in FT_FLAGS + (() if keep else ("layer_norm_eps",)):
        if hasattr(ns, key):
            delattr(ns, key)


def is_lora(state) -> bool:
    """Whether a loaded checkpoint holds a LoRA model."""
    from recadam_fairseq.core.lora import is_lora_state

    return isinstance(state, dict) and isinstance(state.get("model"), dict) and is_lora_state(state["model"])


def merged_checkpoint(state: dict) -> dict:
    """A loaded LoRA checkpoint as a plain RoBERTa one, in place (used by interpolate.py and the forgetting
    harness's measure.py too): merged weights, fairseq's arch, no optimizer state."""
    from recadam_fairseq.core.lora import merged_state_dict

    state["model"] = merged_state_dict(state["model"])
    cfg = state.get("cfg")
    if isinstance(cfg, dict):
        _plain_model_args(cfg.get("model"))
    if state.get("args") is not None:
        _plain_model_args(state["args"])
    state.pop("last_optimizer_state", None)
    return state


def merge(path: str, out: str) -> dict:
    """Write the merged checkpoint of ``path`` to ``out``; returns it."""
    import torch

    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from recadam_fairseq.core.lora import lora_scaling

    from recadam_fairseq.core import checkpoint_file

    try:
        state = checkpoint_file.fairseq_state(path)
    except checkpoint_file.CheckpointFileError as e:  # refused, cut short, not fairseq's: one line
        sys.exit(f"merge_lora.py: error: {e}")
    if not is_lora(state):
        sys.exit(f"merge_lora.py: error: {path}: not a LoRA checkpoint (no '...parametrizations.weight.original' "
                 f"tensors; trained with --lora-rank?)")
    model = state["model"]
    scaling = lora_scaling(model)
    merged_checkpoint(state)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.save(state, out)
    n = sum(1 for k in model if k.endswith(".parametrizations.weight.original"))
    print(f"merge_lora.py: {n} LoRA weights merged (scaling α/r = {scaling:g}) -> {out}")
    return state


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a checkpoint of a --lora-rank run (checkpoint_best.pt, checkpoint_last.pt)")
    ap.add_argument("out", help="where to write the merged checkpoint")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        sys.exit(f"merge_lora.py: error: {args.checkpoint}: no such file")
    merge(args.checkpoint, args.out)


if __name__ == "__main__":
    main()
