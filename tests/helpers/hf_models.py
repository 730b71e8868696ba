"""Tiny Hugging Face encoders with their masked-LM heads, built offline: a BERT with a WordPiece tokenizer, a
RoBERTa with a byte-level BPE one and an XLM-R with a Unigram (SentencePiece) one, each trained here with the
tokenizers library and saved with transformers' save_pretrained (config.json, model.safetensors, tokenizer.json);
and labelled reviews and sentence pairs of their words (tests/test_own_model.py)."""

import csv
import json
import os
import random

TEXT = ["the movie was great and the actors were good", "a terrible film with a boring plot",
        "two dogs run in the snow", "the street is empty tonight", "i loved every minute of it",
        "the plot was boring and the film was long", "a great film with good actors", "i hated every minute"]
POSITIVE = ["the movie was great", "i loved every minute of it", "the actors were good", "a great film"]
NEGATIVE = ["a terrible film with a boring plot", "the plot was boring", "terrible actors", "i hated it"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def _bert():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT * 10, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    model = BertForMaskedLM(BertConfig(vocab_size=tok.get_vocab_size(), max_position_embeddings=64, **SIZES))
    return model, fast


def _roberta_like(kind):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM, XLMRobertaConfig,
                              XLMRobertaForMaskedLM)

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    if kind == "roberta":  # byte-level BPE, as RoBERTa's
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(TEXT * 10, trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<mask>"])
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        config, cls = RobertaConfig, RobertaForMaskedLM
    else:  # a Unigram SentencePiece model, as XLM-R's
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.train_from_iterator(TEXT * 10, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials,
                                                                    unk_token="<unk>"))
        tok.decoder = decoders.Metaspace()
        tok.add_special_tokens(["<mask>"])
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
        config, cls = XLMRobertaConfig, XLMRobertaForMaskedLM
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    model = cls(config(vocab_size=tok.get_vocab_size(), max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                       eos_token_id=2, type_vocab_size=1, **SIZES))
    return model, fast


def make(root):
    """ROOT/{bert,roberta,xlmr}: the three model directories; ROOT/data: reviews (train.tsv, train.csv,
    train.jsonl, dev.*: text, pair_a, pair_b, label, score) and pairs.tsv (sentence1, sentence2, label)."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    paths = {}
    for i, (name, build) in enumerate((("bert", _bert), ("roberta", lambda: _roberta_like("roberta")),
                                       ("xlmr", lambda: _roberta_like("xlmr")))):
        torch.manual_seed(i)
        model, fast = build()
        paths[name] = os.path.join(root, name)
        model.save_pretrained(paths[name])
        fast.save_pretrained(paths[name])
    data = os.path.join(root, "data")
    os.makedirs(data)
    rng = random.Random(0)
    for split, n in (("train", 96), ("dev", 32)):
        rows = []
        for _ in range(n):
            y = rng.random() < 0.5
            rows.append({"text": rng.choice(POSITIVE if y else NEGATIVE), "pair_a": rng.choice(TEXT),
                         "pair_b": rng.choice(TEXT), "label": "positive" if y else "negative",
                         "score": f"{rng.uniform(0, 5):.2f}"})
        fields = list(rows[0])
        with open(os.path.join(data, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\t".join(fields) + "\n")
            f.writelines("\t".join(r[k] for k in fields) + "\n" for r in rows)
        with open(os.path.join(data, f"{split}.csv"), "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            w.writerows(rows)
        with open(os.path.join(data, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(data, "pairs.tsv"), "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tlabel\n")
        for a in POSITIVE + NEGATIVE:
            f.write(f"{a}\t{rng.choice(POSITIVE if a in POSITIVE else NEGATIVE)}\t1\n")
            f.write(f"{a}\t{rng.choice(NEGATIVE if a in POSITIVE else POSITIVE)}\t0\n")
    paths["data"] = data
    return paths
