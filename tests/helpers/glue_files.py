"""Tiny GLUE-format files (every task's official column layout) and a tiny GPT-2 byte-level BPE, written here:
the inputs of data-prep/prepare_glue.py for tests/test_prepare_glue.py, tests/test_glue_multitask.py and
tests/test_predict.py."""

import json
import os

# ----------------------------------------------------------------------------- tiny GLUE

MNLI_TRAIN_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                   "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEAD = MNLI_TRAIN_HEAD[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
             "sentence1", "sentence2", "score"]
PAIR_HEAD = ["index", "sentence1", "sentence2", "label"]


def mnli(i, s1, s2, gold, dev=False):
    # dev rows carry five annotator labels before gold_label; make the first disagree
    labels = [gold] if not dev else ["neutral" if gold != "neutral" else "entailment"] + [gold] * 4
    return [str(i), str(9000 + i), f"{9000 + i}e", "fiction", f"( {s1} )", f"( {s2} )",
            f"(ROOT {s1})", f"(ROOT {s2})", s1, s2, *labels, gold]


def stsb(i, s1, s2, score):
    return [f"{i:04d}", "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", s1, s2, score]


# task -> file -> (header or None, rows); each task also lists (text columns, label column).
GLUE = {
    "CoLA": ((3,), 1, {  # no header; source, label, original mark, sentence
        "train.tsv": (None, [["gj04", "1", "", "The man is good."], ["gj04", "0", "*", "Good the is man."],
                             ["bc01", "1", "", "The movie was bad."], ["bc01", "1", "", "Is the café open?"]]),
        "dev.tsv": (None, [["gj04", "0", "*", "Man the good."], ["gj04", "1", "", "The man said so."]]),
    }),
    "SST-2": ((0,), 1, {  # the official sentences end with a space
        "train.tsv": (["sentence", "label"], [["the movie is good ", "1"], ["a bad , bad movie ", "0"],
                                              ["it 's not the man 's best ", "0"]]),
        "dev.tsv": (["sentence", "label"], [["good movie ", "1"], ["bad man ", "0"], ["\"good\" ", "1"]]),
    }),
    "MRPC": ((3, 4), 0, {  # the header starts with a BOM, as download_glue_data.py writes it
        "train.tsv": (["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                      [["1", "702876", "702977", "The man said it was good.", "He said it is good."],
                       ["0", "2108705", "2108831", "The movie is bad.", "The man is good."],
                       ["1", "1330381", "1330521", "Good man.", "A good man."]]),
        "dev.tsv": (["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                    [["1", "1355540", "1355592", "It is bad.", "It was bad."],
                     ["0", "2029631", "2029565", "The man is here.", "The movie is here."]]),
    }),
    "QQP": ((3, 4), 5, {  # includes malformed rows (wrong column counts) like the official file
        "train.tsv": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                      [["0", "1", "2", "Is the movie good?", "Is the movie bad?", "0"],
                       ["1", "3", "4", "How is the man?", "How is that man?", "1"],
                       ["2", "5", "6", "What did he say", "And"],  # malformed: 5 columns
                       ["3", "7", "8", "Who said it?", "Who said that?", "1"],
                       ["4", "9", "10", "", "Is it empty?", "0"]]),
        "dev.tsv": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                    [["5", "11", "12", "Good?", "Bad?", "0"],
                     ["6", "13", "14", "a", "b", "1", "extra"],  # malformed: 7 columns
                     ["7", "15", "16", "Is the man good?", "Is the man good ?", "1"]]),
    }),
    "STS-B": ((7, 8), 9, {
        "train.tsv": (STSB_HEAD, [stsb(1, "A man is playing.", "A man plays.", "5.000"),
                                  stsb(2, "A movie.", "The man is good.", "0.500"),
                                  stsb(3, "The man said it.", "A man said it.", "3.800")]),
        "dev.tsv": (STSB_HEAD, [stsb(4, "It is good.", "It is bad.", "1.25"),
                                stsb(5, "The movie.", "The movie!", "4.6")]),
    }),
    "MNLI": ((8, 9), -1, {
        "train.tsv": (MNLI_TRAIN_HEAD, [mnli(0, "The man is good.", "The man is bad.", "contradiction"),
                                        mnli(1, 'He said "good".', "He said something.", "entailment"),
                                        mnli(2, "The movie is long.", "The movie is good.", "neutral"),
                                        mnli(3, "It is bad.", "It is not good.", "entailment")]),
        "dev_matched.tsv": (MNLI_DEV_HEAD, [mnli(10, "A man.", "A movie.", "neutral", dev=True),
                                            mnli(11, "Good.", "Bad.", "contradiction", dev=True)]),
        "dev_mismatched.tsv": (MNLI_DEV_HEAD, [mnli(20, "The man said it.", "He said it.", "entailment", dev=True),
                                               mnli(21, "Is it?", "It is.", "neutral", dev=True),
                                               mnli(22, "Bad man.", "Good man.", "contradiction", dev=True)]),
    }),
    "QNLI": ((1, 2), 3, {
        "train.tsv": (["index", "question", "sentence", "label"],
                      [["0", "Who said it?", "The man said it.", "entailment"],
                       ["1", "Is the movie good?", "It is raining.", "not_entailment"]]),
        "dev.tsv": (["index", "question", "sentence", "label"],
                    [["0", "What is good?", "The movie is good.", "entailment"]]),
    }),
    "RTE": ((1, 2), 3, {
        "train.tsv": (PAIR_HEAD, [["0", "The man is good.", "A man is good.", "entailment"],
                                  ["1", "The movie is bad.", "The movie is good.", "not_entailment"],
                                  ["2", "He said it.", "Someone said it.", "entailment"]]),
        "dev.tsv": (PAIR_HEAD, [["0", "It is good.", "It is.", "entailment"],
                                ["1", "It is bad.", "It is good.", "not_entailment"]]),
    }),
    "WNLI": ((1, 2), 3, {
        "train.tsv": (PAIR_HEAD, [["0", "The man said he was good.", "The man was good.", "1"],
                                  ["1", "The movie was bad, so he left.", "The movie left.", "0"]]),
        "dev.tsv": (PAIR_HEAD, [["0", "He is good.", "The man is good.", "1"], ["1", "Bad.", "Good.", "0"]]),
    }),
}
NUM_CLASSES = {"MNLI": 3, "STS-B": 1}
PAIR = {"MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE", "WNLI"}
SPLITS = {"MNLI": {"train": "train.tsv", "valid": "dev_matched.tsv", "valid1": "dev_mismatched.tsv"}}


def write_glue(glue_dir):
    for task, (_, _, files) in GLUE.items():
        os.makedirs(os.path.join(glue_dir, task), exist_ok=True)
        for fname, (header, rows) in files.items():
            write_tsv(os.path.join(glue_dir, task, fname), header, rows)


def write_tsv(path, header, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("\t".join(r) + "\n" for r in ([header] if header else []) + rows)


# ----------------------------------------------------------------------------- tiny GPT-2 BPE

WORDS = ["the", "man", "movie", "good", "bad", "is", "said"]


def write_bpe(bpe_dir):
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab = [b2u[b] for b in range(256)]  # every byte symbol, so any text encodes
    merges = []
    for word in WORDS:
        for sym in (word, b2u[ord(" ")] + word):  # with and without the leading-space marker
            cur = sym[0]
            for ch in sym[1:]:
                if cur + ch not in vocab:
                    merges.append((cur, ch))
                    vocab.append(cur + ch)
                cur += ch
    os.makedirs(bpe_dir, exist_ok=True)
    with open(os.path.join(bpe_dir, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump({tok: i for i, tok in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(bpe_dir, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    # RoBERTa's dict.txt: "<bpe id> <count>", ordered by frequency, not by id
    with open(os.path.join(bpe_dir, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{i} {i + 1}\n" for i in reversed(range(len(vocab))))
    return len(merges)
