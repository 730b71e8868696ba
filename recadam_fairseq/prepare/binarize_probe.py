"""A forgetting-meter probe (``--forgetting-probe DIR``) from text, with the model's dictionary, through
fairseq-preprocess (scripts/binarize_probe.py).

- ``--text FILE``: one sentence a line (mlm: masked-LM on them; pairs needs ``--pairs``);
- ``--pairs FILE``: ``premise<TAB>hypothesis<TAB>label`` lines, label entailment/1 or contradiction/0
  (other labels, e.g. neutral, are skipped);

with ``--dict DICT`` already tokenized as the model's data (RoBERTa: GPT-2 BPE, as for the GLUE data); with
``--model DIR`` (a directory of data-prep/convert_hf_to_fairseq.py) plain text, tokenized by the model's own
tokenizer as data-prep/prepare_task.py tokenizes a task (a pairs file may start with the header
``sentence1<TAB>sentence2<TAB>label``; a masked-LM probe needs a model converted with its masked-LM head). DIR gets
``sentences.{bin,idx}``, ``dict.txt`` (the model's) and for pairs ``pairs.npz``
(premise / hypothesis sentence rows, label): the layout of the forgetting comparison's SNLI probe,
which is thus a pairs probe as it is. The meter runs every sentence at each validation: a probe of more than
MANY_SENTENCES gets a warning (``--sample N`` keeps N pairs or sentences, drawn at random). Bad input: one line,
exit 2.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from typing import List, Optional

import numpy as np

from .prepare_glue import fairseq_preprocess

LABELS = {"entailment": 1, "1": 1, "contradiction": 0, "0": 0}
HEADER = ("sentence1", "sentence2", "label")  # a pairs file's optional header row
PROG = "binarize_probe.py"
# docs/forgetting-meter.md: a few hundred sentences; each validation runs the probe once (the own-model walk-through's
# 1,973 sentences, against 500 dev examples, took 40-46% of its runs)
MANY_SENTENCES = 500


class ProbeError(ValueError):
    """Bad input: one line."""


def read_pairs(path: str):
    """(premises, hypotheses, labels) of the entailment / contradiction rows; the number of rows skipped."""
    prem, hyp, lab, skipped = [], [], [], 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if n == 1 and [c.strip() for c in cols] == list(HEADER):
                continue
            if len(cols) != 3:
                raise ProbeError(f"--pairs {path}, line {n}: expected premise<TAB>hypothesis<TAB>label, got "
                                 f"{len(cols)} column{'s' if len(cols) != 1 else ''}")
            if cols[2].strip() not in LABELS:
                skipped += 1
                continue
            prem.append(cols[0].strip())
            hyp.append(cols[1].strip())
            lab.append(LABELS[cols[2].strip()])
    return prem, hyp, np.array(lab, dtype=np.int64), skipped


def binarize(lines: List[str], out: str, dict_txt: str) -> None:
    """``out/sentences.{bin,idx}`` and ``out/dict.txt`` by fairseq-preprocess --only-source --srcdict."""
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw")
        with open(raw, "w", encoding="utf-8") as f:
            f.writelines(x + "\n" for x in lines)
        fairseq_preprocess(["--only-source", "--srcdict", dict_txt, "--trainpref", raw, "--destdir", tmp,
                            "--workers", "1"])
        for ext in ("bin", "idx"):
            shutil.move(os.path.join(tmp, f"train.{ext}"), os.path.join(out, f"sentences.{ext}"))
        shutil.copyfile(os.path.join(tmp, "dict.txt"), os.path.join(out, "dict.txt"))


def sample(n: int, k: Optional[int]) -> List[int]:
    """``k`` of the rows 0..n-1 at random (seed 0), in their order; all without ``k``."""
    return list(range(n)) if k is None or k >= n else sorted(random.Random(0).sample(range(n), k))


def main(argv: Optional[List[str]] = None) -> dict:
    ap = argparse.ArgumentParser(prog=PROG, description="Binarize a forgetting-meter probe (--forgetting-probe DIR) "
                                                        "with the model's dictionary.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one sentence a line (--forgetting-meter mlm)")
    src.add_argument("--pairs", help="premise<TAB>hypothesis<TAB>label lines, label 1/entailment for a pair that "
                                     "belongs together, 0/contradiction otherwise (--forgetting-meter pairs, or mlm)")
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--dict", help="the model's dict.txt, the text already tokenized (e.g. the task data's "
                                      "input0/dict.txt)")
    model.add_argument("--model", help="a directory of data-prep/convert_hf_to_fairseq.py: plain text, tokenized by "
                                       "its tokenizer")
    ap.add_argument("--out", required=True, help="the probe directory to write")
    ap.add_argument("--sample", type=int, metavar="N", help="keep N of the pairs (--pairs) or sentences (--text), "
                                                            "drawn at random (seed 0): a probe of a few hundred "
                                                            "sentences (default: all)")
    args = ap.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        ap.error(f"--sample {args.sample}: a number of pairs or sentences, at least 1")
    given = ("--text", args.text) if args.text else ("--pairs", args.pairs)
    if not os.path.isfile(given[1]):
        ap.error(f"{given[0]} {given[1]}: no such file")
    tokens = None
    if args.model:
        from .prepare_task import PrepError, Tokens

        try:
            tokens = Tokens(args.model)
        except PrepError as e:
            ap.error(str(e))
        with open(os.path.join(args.model, "arch.json"), encoding="utf-8") as f:
            head = json.load(f).get("lm_head", True)
        if args.text and not head:
            ap.error(f"--text with --model {args.model}: a masked-LM probe needs the model's own masked-LM head, and "
                     f"this one was converted from a checkpoint without one: make a --pairs probe")
        args.dict = os.path.join(args.model, "dict.txt")
    if not os.path.isfile(args.dict):
        ap.error(f"--dict {args.dict}: no such file")

    def tokenized(texts, where):
        if tokens is None:
            return texts
        try:
            return tokens.lines(texts, where)
        except PrepError as e:
            ap.error(str(e))

    if args.text:
        with open(args.text, encoding="utf-8") as f:
            lines = [x.strip() for x in f if x.strip()]
        if not lines:
            ap.error(f"--text {args.text}: no sentence in it")
        lines = [lines[i] for i in sample(len(lines), args.sample)]
        binarize(tokenized(lines, f"--text {args.text}"), args.out, args.dict)
        info = {"sentences": len(lines)}
    else:
        try:
            prem, hyp, lab, skipped = read_pairs(args.pairs)
        except ProbeError as e:
            ap.error(str(e))
        keep = sample(len(lab), args.sample)
        prem, hyp, lab = [prem[i] for i in keep], [hyp[i] for i in keep], lab[keep]
        if not ((lab == 1).any() and (lab == 0).any()):
            ap.error(f"--pairs {args.pairs}: {int((lab == 1).sum())} entailment and {int((lab == 0).sum())} "
                     f"contradiction pairs; the probe needs both")
        uniq, inverse = np.unique(np.array(prem + hyp, dtype=object), return_inverse=True)
        binarize(tokenized(list(uniq), f"--pairs {args.pairs}"), args.out, args.dict)
        n = len(lab)
        np.savez(os.path.join(args.out, "pairs.npz"), premise=inverse[:n], hypothesis=inverse[n:], label=lab)
        info = {"pairs": n, "sentences": len(uniq), "skipped": skipped}
    print(f"{args.out}: " + ", ".join(f"{v} {k}" for k, v in info.items()), file=sys.stderr)
    if info["sentences"] > MANY_SENTENCES:
        what = "pairs" if args.pairs else "sentences"
        print(f"{PROG}: warning: {info['sentences']:,} sentences: the meter runs each at every validation, which "
              f"then costs about what validating {info['sentences']:,} examples does; a few hundred measure it "
              f"(docs/forgetting-meter.md): --sample {MANY_SENTENCES // (2 if args.pairs else 1)} keeps that many "
              f"{what}", file=sys.stderr)
    return info


if __name__ == "__main__":
    main()
