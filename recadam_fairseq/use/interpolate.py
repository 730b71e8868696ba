"""WiSE-FT: a fine-tuned fairseq checkpoint mixed with its pretrained weights, θ_α = (1 − α)·θ* + α·θ_ft.

    python scripts/interpolate.py checkpoints/checkpoint_best.pt --pretrained roberta.base/model.pt \\
        --alpha 0.5 --out wise/checkpoint_wise.pt
    python scripts/interpolate.py checkpoints/checkpoint_best.pt --pretrained roberta.base/model.pt \\
        --alpha 0.25 0.5 0.75 --out wise/checkpoint_wise.pt   # wise/checkpoint_wise_alpha0.25.pt, ...

Every tensor of the fine-tuned model that the pretrained checkpoint has under the same name and shape
is interpolated (the pretrained names after RoBERTa's own renames of released checkpoints:
decoder.* -> encoder.*, emb_layer_norm -> layernorm_embedding); the rest (classification heads,
CA-MTL's task-conditioned modules, R4F's spectral-norm tensors) is the fine-tuned model's; a LoRA
checkpoint is first merged into plain RoBERTa (scripts/merge_lora.py); a mixout checkpoint's weights W
are interpolated under their parametrized names and its targets θ* kept. Each
output is the fine-tuned checkpoint with these model tensors and without optimizer state (as
--no-save-optimizer-state writes it), so fairseq-validate, checkpoint_utils.load_model_ensemble_and_task
and --restore-file (with --reset-optimizer) read it as they read the input. Bad input: one line on
stderr, exit 1.
"""

import argparse
import os
import sys

import torch

from recadam_fairseq.core.anchor import AnchorError, load_checkpoint
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.core.wise_ft import check_alpha, interpolate, shared_names
from recadam_fairseq.core.mixout import mixout_groups
from recadam_fairseq.use import merge_lora


def roberta_names(pretrained, finetuned):
    """θ*'s names as fairseq's RoBERTa upgrades a released checkpoint on load (decoder.* -> encoder.*,
    .emb_layer_norm. -> .layernorm_embedding.); only for an encoder-only pair: a sequence-to-sequence
    model's decoder.* names are its decoder."""
    if (not any(k.startswith("decoder.") for k in pretrained) or any(k.startswith("encoder.") for k in pretrained)
            or any(k.startswith("decoder.") for k in finetuned)):
        return dict(pretrained)
    out = {}
    for k, v in pretrained.items():
        if k.startswith("decoder"):
            k = "encoder" + k[len("decoder"):]
        out[k.replace(".emb_layer_norm.", ".layernorm_embedding.")] = v
    return out


def model_states(finetuned, pretrained):
    """(θ_ft, θ*) as plain state dicts under the same names. A mixout checkpoint's trained W
    (``<module>.parametrizations.weight.original``) pairs with θ*'s ``<module>.weight``; its targets stay."""
    pre = roberta_names(pretrained, finetuned)
    for plain, parts in mixout_groups(finetuned).items():
        if plain in pre:
            pre[parts["original"]] = pre[plain]
    return finetuned, pre


def interpolated_checkpoint(state, pretrained_model, alpha, provenance=None):
    """The fine-tuned checkpoint dict ``state`` with θ_α as its model, no optimizer state and no EMA
    copy (that would be θ_ft's); everything else fairseq reads (cfg, optimizer_history, extra_state) kept."""
    ft, pre = model_states(state["model"], pretrained_model)
    out = {k: v for k, v in state.items() if k != "last_optimizer_state"}
    out["model"] = interpolate(ft, pre, alpha)
    if isinstance(state.get("extra_state"), dict):
        out["extra_state"] = {k: v for k, v in state["extra_state"].items() if k not in ("ema", "ema_fp32_params")}
    out["wise_ft"] = dict(provenance or {}, alpha=alpha, interpolated_tensors=len(shared_names(ft, pre)))
    return out


def output_paths(out, alphas):
    """OUT for one α; OUT's name with _alpha<α> before its extension for several."""
    if len(alphas) == 1:
        return [out]
    stem, ext = os.path.splitext(out)
    return [f"{stem}_alpha{a:g}{ext}" for a in alphas]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad input is one line and exit 1, as everywhere in this tool
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser():
    ap = _Parser(prog="interpolate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("finetuned", metavar="FINETUNED.pt", help="the fine-tuned fairseq checkpoint (θ_ft)")
    ap.add_argument("--pretrained", required=True, metavar="PRETRAINED.pt",
                    help="the pretrained checkpoint it was fine-tuned from (θ*)")
    ap.add_argument("--alpha", required=True, action="extend", nargs="+", metavar="ALPHA",
                    help="weight of the fine-tuned model, in [0, 1] (0: θ*, 1: θ_ft); several: one output each")
    ap.add_argument("--out", required=True, metavar="OUT.pt",
                    help="the output checkpoint; with several α, OUT's name with _alpha<α> before its extension")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        alphas = list(dict.fromkeys(check_alpha(a) for a in args.alpha))
        outs = output_paths(args.out, alphas)
        inputs = {os.path.realpath(args.finetuned), os.path.realpath(args.pretrained)}
        for path in outs:
            if os.path.realpath(path) in inputs:
                raise ConfigError(f"--out {path}: is an input checkpoint")
        import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)

        state = load_checkpoint(args.finetuned)
        if merge_lora.is_lora(state):  # LoRA: its merged plain RoBERTa (W + B·A·α/r) is θ_ft
            merge_lora.merged_checkpoint(state)
            print(f"{args.finetuned}: a LoRA checkpoint, merged into plain RoBERTa weights first")
        if state.get("cfg") is None and state.get("args") is None:
            raise ConfigError(f"{args.finetuned}: not a fairseq training checkpoint (no cfg): fairseq could not load "
                              f"the output")
        try:
            pretrained = load_checkpoint(args.pretrained)["model"]
        except AnchorError as e:
            raise ConfigError(f"--pretrained {e}") from None
        ft, pre = model_states(state["model"], pretrained)
        if not shared_names(ft, pre):
            raise ConfigError(f"{args.finetuned} and --pretrained {args.pretrained} share no model tensor (by name "
                              f"and shape): not a model fine-tuned from it")
        provenance = {"finetuned": args.finetuned, "pretrained": args.pretrained}
        for alpha, path in zip(alphas, outs):
            ckpt = interpolated_checkpoint(state, pretrained, alpha, provenance)
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                torch.save(ckpt, path + ".tmp")
                os.replace(path + ".tmp", path)
            except OSError as e:
                raise ConfigError(f"--out {path}: cannot be written: {e.strerror or e}") from None
            n = ckpt["wise_ft"]["interpolated_tensors"]
            print(f"{path}: α = {alpha:g}, {n} of {len(ckpt['model'])} model tensors interpolated, "
                  f"the others the fine-tuned model's")
    except ConfigError as e:
        print(f"interpolate.py: error: {e}", file=sys.stderr)
        return 1
    return 0

