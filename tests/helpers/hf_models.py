"""Tiny Hugging Face encoders with their masked-LM heads, built offline, each trained here with the tokenizers library
and saved with transformers' save_pretrained (config.json, model.safetensors, the tokenizer's files), as users bring
them: a BERT with a WordPiece tokenizer (and the same with vocab.txt alone, as older checkpoints ship), a RoBERTa with
a byte-level BPE one, an XLM-R with a Unigram (SentencePiece) one, a RoBERTa as the tokenizers tutorial makes it
(``<mask>`` at id 4, vocab.json + merges.txt only), a DistilBERT, a CamemBERT (its specials scattered: <s> at 4,
``<s>NOTUSED`` at 0) and a multilingual MiniLM-like BERT with an XLM-R vocabulary. Every weight is moved off its
init (the masked-LM bias too) so that a tensor left out or misplaced shows; labelled reviews and sentence pairs of
their words (tests/test_own_model.py)."""

import csv
import json
import os
import random
import shutil

TEXT = ["the movie was great and the actors were good", "a terrible film with a boring plot",
        "two dogs run in the snow", "the street is empty tonight", "i loved every minute of it",
        "the plot was boring and the film was long", "a great film with good actors", "i hated every minute"]
POSITIVE = ["the movie was great", "i loved every minute of it", "the actors were good", "a great film"]
NEGATIVE = ["a terrible film with a boring plot", "the plot was boring", "terrible actors", "i hated it"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
ROBERTA_IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
SP = ["<s>", "<pad>", "</s>", "<unk>"]
CAMEMBERT = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<s>", "</s>"]  # camembert-base's first ids
# the models (tests/test_own_model.py's MODELS): directory -> model_type
KINDS = {"bert": "bert", "bert_vocab_txt": "bert", "roberta": "roberta", "xlmr": "xlm-roberta",
         "roberta_mask4": "roberta", "distilbert": "distilbert", "camembert": "camembert", "mbert_sp": "bert"}


def _wordpiece():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT * 10, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def _unigram(specials, vocab_size=150):
    """A Unigram (SentencePiece) tokenizer with ``specials`` first and <mask> last, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(TEXT * 10, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                                unk_token="<unk>"))
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<mask>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")


def _byte_bpe(specials):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")


def _model(kind, vocab_size, **ids):
    from transformers import (BertConfig, BertForMaskedLM, CamembertConfig, CamembertForMaskedLM, DistilBertConfig,
                              DistilBertForMaskedLM, RobertaConfig, RobertaForMaskedLM, XLMRobertaConfig,
                              XLMRobertaForMaskedLM)

    if kind == "distilbert":
        return DistilBertForMaskedLM(DistilBertConfig(vocab_size=vocab_size, max_position_embeddings=64, dim=32,
                                                      n_layers=2, n_heads=2, hidden_dim=64, pad_token_id=0))
    config, cls = {"bert": (BertConfig, BertForMaskedLM), "roberta": (RobertaConfig, RobertaForMaskedLM),
                   "xlm-roberta": (XLMRobertaConfig, XLMRobertaForMaskedLM),
                   "camembert": (CamembertConfig, CamembertForMaskedLM)}[kind]
    positions = 64 if kind == "bert" else 66  # (RoBERTa's table counts the two rows its numbering skips)
    return cls(config(vocab_size=vocab_size, max_position_embeddings=positions, **ids, **SIZES))


def _tutorial_roberta(path):
    """The tokenizers tutorial's RoBERTa (EsperBERTo): ByteLevelBPETokenizer with <mask> at id 4, saved as
    vocab.json and merges.txt alone."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TEXT * 10, vocab_size=300, min_frequency=1, special_tokens=SP + ["<mask>"])
    os.makedirs(path)
    tok.save_model(path)
    return _model("roberta", tok.get_vocab_size(), **ROBERTA_IDS), None


def build(name, path):
    """The model ``name`` of KINDS saved at ``path``."""
    if name == "roberta_mask4":
        model, fast = _tutorial_roberta(path)
    elif name in ("bert", "distilbert"):
        fast = _wordpiece()
        model = _model(KINDS[name], len(fast))
    elif name == "roberta":
        fast = _byte_bpe(SP)
        model = _model("roberta", len(fast), **ROBERTA_IDS)
    elif name == "camembert":
        fast = _unigram(CAMEMBERT)
        model = _model("camembert", len(fast), **dict(ROBERTA_IDS, bos_token_id=4, eos_token_id=5))
    else:  # xlmr; mbert_sp: a BERT (its positions, token types) with an XLM-R vocabulary, as multilingual MiniLMs
        fast = _unigram(SP)
        model = _model(KINDS[name], len(fast), **(ROBERTA_IDS if name == "xlmr" else dict(pad_token_id=1)))
    return model, fast


def make(root):
    """ROOT/<name> for each of KINDS; ROOT/data: reviews (train and dev as .tsv, .csv, .jsonl and .parquet: text,
    pair_a, pair_b, label, score) and pairs.tsv (sentence1, sentence2, label)."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    paths = {}
    for i, name in enumerate(k for k in KINDS if k != "bert_vocab_txt"):
        torch.manual_seed(i)
        paths[name] = os.path.join(root, name)
        model, fast = build(name, paths[name])
        with torch.no_grad():  # off the init (LayerNorms 1/0, biases 0): a tensor misplaced or left out shows
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
            model.get_output_embeddings().bias.normal_()
        model.save_pretrained(paths[name])
        if fast is not None:
            fast.save_pretrained(paths[name])
    # the BERT as older checkpoints ship: vocab.txt, no tokenizer.json (nor the config naming the fast class)
    paths["bert_vocab_txt"] = os.path.join(root, "bert_vocab_txt")
    shutil.copytree(paths["bert"], paths["bert_vocab_txt"])
    with open(os.path.join(paths["bert"], "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(paths["bert_vocab_txt"], name))
    with open(os.path.join(paths["bert_vocab_txt"], "vocab.txt"), "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in sorted(vocab, key=vocab.get))
    paths["data"] = write_data(os.path.join(root, "data"))
    return paths


def write_data(data):
    import pyarrow as pa
    import pyarrow.parquet as pq

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
        # as the datasets library writes it: the score a number, the columns typed
        table = pa.table({k: [float(r[k]) if k == "score" else r[k] for r in rows] for k in fields})
        pq.write_table(table, os.path.join(data, f"{split}.parquet"))
    with open(os.path.join(data, "pairs.tsv"), "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tlabel\n")
        for a in POSITIVE + NEGATIVE:
            f.write(f"{a}\t{rng.choice(POSITIVE if a in POSITIVE else NEGATIVE)}\t1\n")
            f.write(f"{a}\t{rng.choice(NEGATIVE if a in POSITIVE else POSITIVE)}\t0\n")
    return data
