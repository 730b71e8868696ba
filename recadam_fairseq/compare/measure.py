"""What one run is measured by, from its checkpoint (plain fairseq model, eval mode, no dropout).

- target accuracy: the classification head on the target task's held-out split (``valid``);
- zero-shot SNLI AUC: the pretrained skill of all-MiniLM-L6-v2. Each sentence is encoded as
  ``<s> pieces </s>`` (= BERT's ``[CLS] ... [SEP]``), the last layer's hidden states are mean-pooled
  over its tokens, as sentence-transformers does for this model (it L2-normalizes afterwards, which
  the cosine ignores), and cos(premise, hypothesis) scores "entailment" against "contradiction":
  the ROC-AUC of that score. Forgetting = the fine-tuned AUC minus the pretrained one;
- weight distance: ‖θ − θ*‖₂ over the tensors of the pretrained checkpoint (the encoder; RecAdam's
  anchor), squared = what recadam logs as ``recadam_dist``.

With ``--interpolate ALPHA ...`` the same three are also measured on the WiSE-FT interpolations
θ_α = (1 − α)·θ* + α·θ of the last checkpoint given (a run's final one; scripts/interpolate.py's
interpolation, done in memory: nothing is written).
"""

import argparse
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from recadam_fairseq.core import probes  # the probes' math, shared with the forgetting meter
from recadam_fairseq.use import interpolate as wise  # the checkpoints' interpolation (scripts/interpolate.py)
from recadam_fairseq.use import merge_lora  # LoRA checkpoints as plain RoBERTa (scripts/merge_lora.py)

HEAD = "sentence_classification_head"
SEP = 2  # --separator-token of every run: </s>


def load(checkpoint: str, data_dir: str):
    """(model in eval mode, its task) of a fairseq checkpoint; ``data_dir``: where its dictionaries are."""
    import recadam_fairseq
    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from fairseq import checkpoint_utils, tasks

    recadam_fairseq.register()  # the run's task, model and criterion may be the plug-in's
    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f"{checkpoint}: no such checkpoint")
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, arg_overrides={"data": data_dir})
    if merge_lora.is_lora(state):  # measured as its merged plain RoBERTa: W + B·A·α/r under RoBERTa's names
        with tempfile.TemporaryDirectory() as tmp:
            merged = os.path.join(tmp, "merged.pt")
            raw = torch.load(checkpoint, map_location="cpu", weights_only=True)  # cfg as saved, not a DictConfig
            torch.save(merge_lora.merged_checkpoint(raw), merged)
            return load(merged, data_dir)
    sn_heads = sorted({k.split(".")[1] for k in state["model"]
                       if k.startswith("classification_heads.") and k.endswith(".out_proj.weight_orig")})
    if not sn_heads:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_dir})
        return models[0].eval(), task
    # R4F (--spectral-norm-classification-head): fairseq 0.12's RobertaModel.upgrade_state_dict_named
    # reads the head's out_proj.weight, which spectral norm stores as weight_orig/_u/_v (a KeyError in
    # load_model_ensemble_and_task); build the model and load the tensors without that upgrade.
    task = tasks.setup_task(state["cfg"].task)
    model = task.build_model(state["cfg"].model)
    for name in sn_heads:
        if name not in model.classification_heads:
            model.register_classification_head(
                name, num_classes=state["model"][f"classification_heads.{name}.out_proj.weight_orig"].shape[0])
    torch.nn.Module.load_state_dict(model, state["model"], strict=True)
    return model.eval(), task


def sentences(prefix: str):
    """The binarized sentences at ``prefix`` (.bin/.idx), each ``pieces </s>``."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(prefix)
    return [ds[i].long() for i in range(len(ds))]


def batches(items, batch_size: int, pad: int, bos: int):
    """(row indices, padded ``<s> item`` tokens) in length order (core/probes.py, shared with the meter)."""
    return probes.batches(items, batch_size, pad, bos)


@torch.inference_mode()
def mean_pooled(model, items, batch_size: int = 128, pad: int = 1, bos: int = 0) -> torch.Tensor:
    """(n, dim) mean of the last layer's hidden states over each sentence's tokens (pads excluded)."""
    return probes.mean_pooled(lambda tokens: model(tokens, features_only=True)[0], items, batch_size, pad, bos)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    return probes.roc_auc(labels, scores)


def snli_auc(model, snli_dir: str, embeddings: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """ROC-AUC of cos(premise, hypothesis) for entailment (1) vs contradiction (0): the pair probe of
    core/probes.py, which the forgetting meter (``--forgetting-meter pairs``) logs during training."""
    pairs = np.load(os.path.join(snli_dir, "pairs.npz"))
    if embeddings is None:
        embeddings = mean_pooled(model, sentences(os.path.join(snli_dir, "sentences")))
    return probes.pair_auc(embeddings, pairs["premise"], pairs["hypothesis"], pairs["label"])


@torch.inference_mode()
def target_accuracy(model, target_dir: str, split: str = "valid", batch_size: int = 128,
                    head: Optional[str] = None) -> Dict[str, float]:
    """Accuracy of the classification head on ``split`` (targets: label ids − fairseq's 4 specials); a
    pair task's input is ``input0 --separator-token input1``, as sentence_prediction feeds it."""
    head = head or head_of(model)
    items = sentences(os.path.join(target_dir, "input0", split))
    if os.path.isfile(os.path.join(target_dir, "input1", split + ".idx")):  # pairs: as sentence_prediction
        items = [torch.cat([a, a.new_tensor([SEP]), b])  # <s> a </s> </s> b </s> (<s> added by batches())
                 for a, b in zip(items, sentences(os.path.join(target_dir, "input1", split)))]
    target = torch.stack([x[0] for x in sentences(os.path.join(target_dir, "label", split))]) - 4
    pred = torch.empty_like(target)
    for rows, tokens in batches(items, batch_size, pad=1, bos=0):
        logits, _ = model(tokens, features_only=True, classification_head_name=head)
        pred[torch.as_tensor(rows)] = logits.argmax(-1)
    return {"accuracy": float((pred == target).double().mean()), "n": len(items)}


def head_of(model) -> str:
    """The head to read: sentence_prediction's, or the one head of a single-task glue_multitask run."""
    heads = list(getattr(model, "classification_heads", {}))
    if HEAD in heads:
        return HEAD
    if len(heads) == 1:
        return heads[0]
    raise ValueError(f"the model has classification heads {heads}: expected {HEAD!r} or exactly one")


def distance(params: Dict[str, torch.Tensor], pretrained: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """‖θ − θ*‖₂ (and its square, recadam's ``recadam_dist``) over the model's parameters that the
    pretrained checkpoint has with the same shape; relative to ‖θ*‖₂. ``params``: named_parameters()
    (a tied tensor counts once, as in recadam's anchor; a state dict would list it twice). A
    parametrized weight (``--mixout``) counts under its plain name: W itself, what evaluation reads."""
    params = {k.replace(".parametrizations.weight.original", ".weight"): v.detach() for k, v in params.items()}
    names = [k for k, v in params.items() if k in pretrained and pretrained[k].shape == v.shape]
    if not names:
        raise ValueError("the checkpoint shares no tensor with the pretrained model")
    sq = sum(float(torch.sum((params[k].double() - pretrained[k].double()) ** 2)) for k in names)
    ref = sum(float(torch.sum(pretrained[k].double() ** 2)) for k in names)
    return {"dist": sq ** 0.5, "dist_sq": sq, "rel_dist": (sq / ref) ** 0.5, "tensors": len(names)}


def parse_targets(specs: Sequence[str]) -> Dict[Optional[str], str]:
    """``--target`` values: one DIR (the model's one head), or NAME=DIR per task of a multi-task model
    (head ``head_name(NAME)``, as glue_multitask names them)."""
    named = dict(x.split("=", 1) for x in specs if "=" in x)
    if len(named) == len(specs):
        return named
    if len(specs) == 1:
        return {None: specs[0]}
    raise ValueError(f"--target {' '.join(specs)}: one DIR, or NAME=DIR for each task of a multi-task model")


def measures(model, pretrained_state: Dict[str, torch.Tensor], target_dir,
             snli_dir: str) -> Dict[str, float]:
    """All three measures of a loaded model; ``target_dir``: a directory, or {task name: directory} (a
    multi-task model: the mean accuracy over the tasks, each under ``task_accuracy``)."""
    if isinstance(target_dir, dict) and None not in target_dir:
        from recadam_fairseq.core.glue_tasks import head_name

        per = {n: target_accuracy(model, d, head=head_name(n))["accuracy"] for n, d in target_dir.items()}
        out = {"target_accuracy": float(np.mean(list(per.values()))), "task_accuracy": per}
    else:
        d = target_dir[None] if isinstance(target_dir, dict) else target_dir
        out = {"target_accuracy": target_accuracy(model, d)["accuracy"]}
    out.update({f"snli_{k}": v for k, v in snli_auc(model, snli_dir).items()})
    out.update(distance(dict(model.named_parameters()), pretrained_state))
    return out


def measure_run(checkpoint: str, pretrained_state: Dict[str, torch.Tensor], target_dir: str,
                snli_dir: str, data_dir: Optional[str] = None, alphas: Sequence[float] = ()) -> dict:
    """All three measures of one fine-tuned checkpoint; ``data_dir``: the run's data path (where its
    task finds the dictionaries; default ``target_dir``). With ``alphas``, also those of its
    interpolations with θ*, under ``interpolated``."""
    first = target_dir if isinstance(target_dir, str) else next(iter(target_dir.values()))
    model, _ = load(checkpoint, data_dir or first)
    out = measures(model, pretrained_state, target_dir, snli_dir)
    if alphas:
        out["interpolated"] = measure_interpolated(model, pretrained_state, alphas, target_dir, snli_dir)
    return out


def measure_interpolated(model, pretrained_state: Dict[str, torch.Tensor], alphas: Sequence[float],
                         target_dir: str, snli_dir: str) -> List[dict]:
    """[{alpha, measures}] of θ_α = (1 − α)·θ* + α·θ for each α, θ the loaded model's weights (heads
    and modules θ* lacks are θ's at every α); the model holds θ again afterwards."""
    from recadam_fairseq.core.wise_ft import interpolate

    state = {k: v.clone() for k, v in model.state_dict().items()}
    own, pre = wise.model_states(state, pretrained_state)
    out = []
    for alpha in alphas:
        torch.nn.Module.load_state_dict(model, interpolate(own, pre, alpha), strict=True)
        out.append(dict(alpha=alpha, **measures(model, pretrained_state, target_dir, snli_dir)))
    torch.nn.Module.load_state_dict(model, state, strict=True)
    return out


def num_updates(checkpoint: str) -> int:
    """The update count fairseq saved in a checkpoint."""
    import recadam_fairseq.safe_globals  # noqa: F401

    state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    return int(state["optimizer_history"][-1]["num_updates"])


def main(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(description="Measure fine-tuned checkpoints (target accuracy, SNLI AUC, "
                                             "distance to the pretrained weights); prints a JSON list.")
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--data", required=True, help="the run's data path (its task's dictionaries)")
    ap.add_argument("--target", "--sentiment", dest="sentiment", required=True, nargs="+", metavar="[NAME=]DIR",
                    help="the target task's binarized data (valid split); NAME=DIR for each task of a multi-task "
                         "run (its head: glue_multitask's for NAME)")
    ap.add_argument("--snli", required=True, help="the SNLI probe (sentences, pairs.npz)")
    ap.add_argument("--pretrained", required=True, help="the pretrained checkpoint (θ*)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--interpolate", type=float, nargs="+", metavar="ALPHA",
                    help="also measure the last checkpoint's interpolations (1 − α)·θ* + α·θ at these α "
                         "(a run's final checkpoint comes last), under 'interpolated' in its entry")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    args = ap.parse_args(argv)
    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.core.wise_ft import check_alpha

    try:
        args.sentiment = parse_targets(args.sentiment)
    except ValueError as e:
        ap.error(str(e))
    try:
        for a in args.interpolate or []:
            check_alpha(a, "--interpolate")
    except ConfigError as e:
        ap.error(str(e))
    import logging

    import recadam_fairseq.safe_globals  # noqa: F401

    logging.getLogger("fairseq").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    pretrained = torch.load(args.pretrained, map_location="cpu", weights_only=True)["model"]
    out = []
    for i, ckpt in enumerate(args.checkpoints):
        res = {"checkpoint": os.path.basename(ckpt), "updates": num_updates(ckpt)}
        alphas = args.interpolate if args.interpolate and i == len(args.checkpoints) - 1 else ()
        res.update(measure_run(ckpt, pretrained, args.sentiment, args.snli, args.data, alphas))
        out.append(res)
    text = json.dumps(out, indent=2) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return out


if __name__ == "__main__":
    main()
