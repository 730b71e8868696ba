"""Export a fine-tuned sentence classifier to Hugging Face's ``RobertaForSequenceClassification``.

    python scripts/export_hf.py RUN_DIR OUT [--data DIR] [--task-name NAME] [--bpe-dir gpt2_bpe]
        [--checkpoint-file checkpoint_best.pt]

RUN_DIR is a run directory or a checkpoint, loaded as ``scripts/glue/predict.py`` loads it (so LoRA
runs, ``interpolate.py``'s output and one head of a multi-task run of plain RoBERTa work). ``OUT`` gets
``model.safetensors`` and ``config.json`` (the label names of fairseq's label dictionary as
``id2label``; ``problem_type`` regression for STS-B). Weights are read from the loaded modules, so a
LoRA or Mixout weight is the one the model computes. The export prints the largest difference of the
two models' logits on a few token sequences.

The tokenizer: with ``--bpe-dir`` (encoder.json, vocab.bpe of the run's data) OUT also gets a
``RobertaTokenizer`` (``vocab.json``: each BPE token at its fairseq dictionary id; ``merges.txt``:
vocab.bpe), which encodes text as ``prepare_glue.py`` does. A model whose dictionary is not GPT-2
BPE (the tiny model's words) has no Hugging Face tokenizer: feed it fairseq's ids.

Not transformers' ``convert_roberta_original_pytorch_checkpoint_to_pytorch.py``: its wheels do not
ship it, it loads through ``RobertaModel.from_pretrained`` (GPT-2 BPE from the network), reads
``emb_layer_norm`` (``layernorm_embedding`` since fairseq 0.10) and takes only a head named ``mnli``.
The mapping of each layer is ``convert_hf.LAYER_MAP`` (BERT and RoBERTa share Hugging Face's layout).
"""

import argparse
import json
import logging
import os
import sys

from recadam_fairseq.prepare.convert_hf import LAYER_MAP
from recadam_fairseq.use.predict import Classifier, PredictError, load

PROG = "export_hf.py"
ACTIVATIONS = {"gelu": "gelu", "gelu_accurate": "gelu_new", "relu": "relu", "tanh": "tanh"}  # fairseq -> HF


def hf_config(clf: Classifier):
    """The RobertaConfig of the fairseq model (checked to be a post-LN RoBERTa that HF computes alike)."""
    from transformers import RobertaConfig

    model, args = clf.model, clf.model.args
    if getattr(model, "is_task_conditioned", False):
        raise PredictError(f"{clf.where}: CA-MTL's task-conditioned layers have no Hugging Face counterpart")
    enc = model.encoder.sentence_encoder
    head = model.classification_heads[clf.head]
    problems = []
    if getattr(args, "encoder_normalize_before", False):
        problems.append("a pre-LN encoder (--encoder-normalize-before)")
    if enc.layernorm_embedding is None or enc.embed_scale not in (None, 1.0):
        problems.append("no embedding LayerNorm, or a scaled embedding")
    if args.activation_fn not in ACTIVATIONS or getattr(args, "pooler_activation_fn", "tanh") != "tanh":
        problems.append(f"activation {args.activation_fn} / pooler {args.pooler_activation_fn}")
    if head.dense.out_features != enc.embed_tokens.embedding_dim:
        problems.append(f"a head of inner dim {head.dense.out_features}")
    if problems:
        raise PredictError(f"{clf.where}: not a RoBERTa that RobertaForSequenceClassification computes: "
                           + "; ".join(problems))
    d, layer = clf.task.source_dictionary, enc.layers[0]
    labels = clf.labels
    named = {} if clf.regression else dict(id2label=dict(enumerate(labels)),
                                           label2id={name: i for i, name in enumerate(labels)})
    return RobertaConfig(
        vocab_size=enc.embed_tokens.num_embeddings, hidden_size=enc.embed_tokens.embedding_dim,
        num_hidden_layers=len(enc.layers), num_attention_heads=layer.self_attn.num_heads,
        intermediate_size=layer.fc1.out_features, hidden_act=ACTIVATIONS[args.activation_fn],
        max_position_embeddings=enc.embed_positions.num_embeddings, type_vocab_size=1,
        layer_norm_eps=enc.layernorm_embedding.eps, pad_token_id=d.pad(), bos_token_id=d.bos(), eos_token_id=d.eos(),
        hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.attention_dropout,
        classifier_dropout=args.pooler_dropout,
        num_labels=1 if clf.regression else len(labels), **named,
        problem_type="regression" if clf.regression else "single_label_classification",
    )


def hf_tensors(clf: Classifier) -> dict:
    """RobertaForSequenceClassification's state dict from the fairseq modules (their computed weights)."""
    import torch

    enc = clf.model.encoder.sentence_encoder
    head = clf.model.classification_heads[clf.head]
    with torch.no_grad():  # a forward first: spectral norm (R4F) computes its head weight in a pre-hook
        clf.model.classification_heads[clf.head](enc.embed_tokens.weight.new_zeros(1, 1, enc.embed_tokens.embedding_dim))

    def lin(mod, name):
        return {f"{name}.weight": mod.weight, f"{name}.bias": mod.bias}

    e = "roberta.embeddings."
    out = {e + "word_embeddings.weight": enc.embed_tokens.weight,
           e + "position_embeddings.weight": enc.embed_positions.weight,
           e + "token_type_embeddings.weight": torch.zeros_like(enc.embed_tokens.weight[:1]),  # RoBERTa has none
           **lin(enc.layernorm_embedding, e + "LayerNorm")}
    for i, layer in enumerate(enc.layers):
        for ours, theirs in LAYER_MAP.items():
            mod = layer
            for part in ours.split("."):
                mod = getattr(mod, part)
            out.update(lin(mod, f"roberta.encoder.layer.{i}.{theirs}"))
    out.update(lin(head.dense, "classifier.dense"))
    out.update(lin(head.out_proj, "classifier.out_proj"))
    return {k: v.detach().float().cpu().contiguous().clone() for k, v in out.items()}


def to_hf(clf: Classifier):
    """The Hugging Face model (eval mode, float32) of a loaded classifier."""
    from transformers import RobertaForSequenceClassification

    hf = RobertaForSequenceClassification(hf_config(clf)).eval()
    missing, unexpected = hf.load_state_dict(hf_tensors(clf), strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:  # a transformers layout this mapping does not know
        raise PredictError(f"transformers' RobertaForSequenceClassification: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return hf


def largest_logit_difference(clf: Classifier, hf, seed: int = 0) -> float:
    """max |fairseq logits - HF logits| on a few right-padded random token sequences of different lengths."""
    import torch
    from fairseq.data import data_utils

    d, g = clf.task.source_dictionary, torch.Generator().manual_seed(seed)
    rows = [torch.cat([torch.tensor([d.bos()]), torch.randint(d.nspecial, len(d), (n,), generator=g),
                       torch.tensor([d.eos()])]) for n in (5, 11, 3)]
    toks = data_utils.collate_tokens(rows, d.pad())
    device = next(clf.model.parameters()).device
    with torch.no_grad():
        feats, _ = clf.model(toks.to(device), features_only=True)
        ours = clf.model.classification_heads[clf.head](feats).float().cpu()
        theirs = hf(input_ids=toks, attention_mask=toks.ne(d.pad()).long()).logits
    return float((ours - theirs).abs().max())


def write_tokenizer(dictionary, bpe_dir: str, out: str):
    """transformers' RobertaTokenizer (vocab.json: BPE token -> fairseq id; merges.txt: vocab.bpe), saved to OUT."""
    from transformers import RobertaTokenizer

    with open(os.path.join(bpe_dir, "encoder.json"), encoding="utf-8") as f:
        token_of = {i: tok for tok, i in json.load(f).items()}
    vocab = {}
    for i, sym in enumerate(dictionary.symbols):  # fairseq's dict.txt lists GPT-2 ids; specials keep their names
        tok = token_of.get(int(sym), sym) if sym.isdigit() and i >= dictionary.nspecial else sym
        vocab.setdefault(tok, i)
    with open(os.path.join(bpe_dir, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f if line.strip() and not line.startswith("#version")]
    tok = RobertaTokenizer(vocab=vocab, merges=merges)  # transformers >= 5: the vocabulary and merges themselves
    tok.save_pretrained(out)
    return tok


def bare_labels_note(labels) -> str:
    """A line for label names that are bare numbers (GLUE's SST-2: "0", "1", ordered as fairseq's label dictionary
    counted them): id2label maps each output to its name, which need not be the output's own index."""
    if not labels or not all(str(n).lstrip("-").isdigit() for n in labels):
        return ""
    shown = ", ".join(f"{i}: {n!r}" for i, n in enumerate(labels))
    return (f"the label names are bare numbers as in the data, not words: id2label is {{{shown}}} (output i is "
            f"the label named, not label i); edit id2label in config.json to name them")


def export(run: str, out: str, data=None, task_name=None, bpe_dir=None, checkpoint_file=None):
    """Write OUT; return the largest logit difference measured and a note on the label names ("" if none)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise PredictError("transformers is not installed: pip install 'recadam-fairseq[export]'") from None
    model, task, ckpt = load(run, data, checkpoint_file, cpu=True)
    clf = Classifier(model.float(), task, task_name, bpe_dir, where=ckpt)
    if bpe_dir is not None:
        clf.encoder  # noqa: B018  (the BPE files and the dictionary checked as for predict)
    hf = to_hf(clf)
    diff = largest_logit_difference(clf, hf)
    os.makedirs(out, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Writing model shards" bar: one file here
    hf.save_pretrained(out)  # model.safetensors, config.json
    if bpe_dir is not None:
        write_tokenizer(task.source_dictionary, bpe_dir, out)
    return diff, "" if clf.regression else bare_labels_note(clf.labels)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run directory (runs/TASK/NAME/seedN) or a checkpoint file")
    ap.add_argument("out", help="output directory: model.safetensors, config.json (+ the tokenizer's files)")
    ap.add_argument("--data", help="the <TASK>-bin directory (multi-task: their parent); default: the run's")
    ap.add_argument("--task-name", help="the task of a multi-task run (its head)")
    ap.add_argument("--bpe-dir", help="encoder.json and vocab.bpe of the run's data: also export a tokenizer")
    ap.add_argument("--checkpoint-file", help="in the run directory (default: checkpoint_best.pt else checkpoint_last.pt)")
    args = ap.parse_args(argv)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    try:
        diff, note = export(args.run, args.out, args.data, args.task_name, args.bpe_dir, args.checkpoint_file)
    except PredictError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    what = "model, tokenizer" if args.bpe_dir else "model (no tokenizer: give --bpe-dir for one)"
    print(f"{PROG}: {what} -> {args.out}; largest logit difference to fairseq {diff:.2e}")
    if note:
        print(f"{PROG}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
