#!/usr/bin/env python
"""Make a tiny "pretrained" RoBERTa and a tiny GLUE-style classification set, on CPU.

Used by `make demo` and the tests (real RoBERTa weights and GLUE cannot be downloaded there):

  OUT/lm-bin/           masked-LM data (generated text, word-level dictionary)
  OUT/pretrained.pt     RoBERTa (2 layers, dim 64) after a few dozen masked-LM updates
  OUT/cls-bin/          sentence_prediction data: input0/ (sentences), label/ (0/1)

The classification label is 1 when a sentence holds three "positive" words and one "negative"
one, 0 for the reverse, so a tiny model learns it in a few dozen updates.
"""

import argparse
import os
import random
import subprocess
import sys

# The architecture of the tiny model; fine-tuning commands must repeat it.
TINY_ARCH = [
    "--arch", "roberta", "--encoder-layers", "2", "--encoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--max-positions", "64",
]


def run(cmd, log):
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}), see {log}:\n  {' '.join(cmd)}")


def preprocess(args):
    """fairseq-preprocess, in this process (saves a fairseq start-up per call)."""
    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(args))


def write_lines(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_text(rng, vocab, n, lo=6, hi=20):
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pretrain-updates", type=int, default=40)
    ap.add_argument("--train-size", type=int, default=256)
    ap.add_argument("--valid-size", type=int, default=64)
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    out = os.path.abspath(args.out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    pos = [f"good{i}" for i in range(8)]
    neg = [f"bad{i}" for i in range(8)]
    vocab = [f"w{i}" for i in range(80)] + pos + neg

    write_lines(os.path.join(raw, "lm.train"), make_text(rng, vocab, 600))
    write_lines(os.path.join(raw, "lm.valid"), make_text(rng, vocab, 60))
    for split, n in (("train", args.train_size), ("valid", args.valid_size)):
        labels, sents = [], []
        for words in make_text(rng, vocab, n):
            label = rng.randint(0, 1)
            words = words.split()
            for w in rng.sample(pos if label else neg, 3) + rng.sample(neg if label else pos, 1):
                words.insert(rng.randint(0, len(words)), w)
            labels.append(str(label))
            sents.append(" ".join(words))
        write_lines(os.path.join(raw, f"cls.{split}.input0"), sents)
        write_lines(os.path.join(raw, f"cls.{split}.label"), labels)

    pre = ["--only-source", "--workers", "1"]
    lm_bin = os.path.join(out, "lm-bin")
    preprocess(pre + ["--trainpref", f"{raw}/lm.train", "--validpref", f"{raw}/lm.valid", "--destdir", lm_bin])
    cls_bin = os.path.join(out, "cls-bin")
    preprocess(pre + ["--trainpref", f"{raw}/cls.train.input0", "--validpref", f"{raw}/cls.valid.input0",
                      "--destdir", f"{cls_bin}/input0", "--srcdict", f"{lm_bin}/dict.txt"])
    preprocess(pre + ["--trainpref", f"{raw}/cls.train.label", "--validpref", f"{raw}/cls.valid.label",
                      "--destdir", f"{cls_bin}/label"])

    save = os.path.join(out, "pretrain")
    run([sys.executable, "-m", "fairseq_cli.train", lm_bin, "--task", "masked_lm", "--criterion", "masked_lm",
         *TINY_ARCH, "--tokens-per-sample", "64", "--batch-size", "16",
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
         "--lr-scheduler", "fixed", "--max-update", str(args.pretrain_updates), "--seed", str(args.seed),
         "--cpu", "--num-workers", "0", "--save-dir", save, "--no-epoch-checkpoints",
         "--disable-validation", "--log-format", "simple", "--log-interval", "10"],
        os.path.join(out, "pretrain.log"))
    os.replace(os.path.join(save, "checkpoint_last.pt"), os.path.join(out, "pretrained.pt"))
    print(os.path.join(out, "pretrained.pt"))


if __name__ == "__main__":
    main()
