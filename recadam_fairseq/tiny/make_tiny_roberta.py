"""Make a tiny "pretrained" RoBERTa and a tiny GLUE-style classification set, on CPU.

Used by `make demo` and the tests (real RoBERTa weights and GLUE cannot be downloaded there):

  OUT/lm-bin/           masked-LM data (generated text, word-level dictionary)
  OUT/pretrained.pt     RoBERTa (2 layers, dim 64) after a few dozen masked-LM updates
  OUT/cls-bin/          sentence_prediction data: input0/ (sentences), label/ (0/1)
  OUT/glue-bin/         the same kind of data laid out as data-prep/prepare_glue.py writes GLUE
                        (<TASK>-bin/input0, input1, label, labels.json): SST-2 (these sentences),
                        RTE (sentence pairs) and STS-B (pairs, a score in [0, 1]), for
                        scripts/glue/finetune.sh and multitask.sh

The classification label is 1 when a sentence holds three "positive" words and one "negative"
one, 0 for the reverse, so a tiny model learns it in a few dozen updates. A pair is "entailment"
(RTE) when its second sentence leans positive; its STS-B score is 0.2, plus 0.3 per sentence that
leans positive, plus noise.
"""

import argparse
import json
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
    """fairseq-preprocess, in this process (saves a fairseq start-up per call); its report goes to
    <destdir>/preprocess.log, not the terminal."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    log = logging.getLogger("fairseq_cli.preprocess")
    level, log.level = log.level, logging.WARNING
    try:
        fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(args))
    finally:
        log.setLevel(level)


def write_lines(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_text(rng, vocab, n, lo=6, hi=20):
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def polar_sentences(rng, vocab, pos, neg, n):
    """n sentences with three words of one polarity and one of the other: (label 0/1, sentence)."""
    out = []
    for words in make_text(rng, vocab, n):
        label = rng.randint(0, 1)
        words = words.split()
        for w in rng.sample(pos if label else neg, 3) + rng.sample(neg if label else pos, 1):
            words.insert(rng.randint(0, len(words)), w)
        out.append((label, " ".join(words)))
    return out


def write_glue(out, raw, rng, vocab, pos, neg, cls_raw, sizes):
    """OUT/glue-bin/{SST-2,RTE,STS-B}-bin in prepare_glue.py's layout, with the tiny dictionary."""
    glue = os.path.join(out, "glue-bin")
    dict_txt = os.path.join(out, "lm-bin", "dict.txt")
    for task, pair, labels in (("SST-2", False, ("0", "1")), ("RTE", True, ("entailment", "not_entailment")),
                               ("STS-B", True, None)):
        dest = os.path.join(glue, f"{task}-bin")
        for split, n in sizes:
            if not pair:
                rows = cls_raw[split]
            else:
                first = polar_sentences(rng, vocab, pos, neg, n)
                second = polar_sentences(rng, vocab, pos, neg, n)
                rows = [((a, b), s1, s2) for (a, s1), (b, s2) in zip(first, second)]
            stem = os.path.join(raw, f"{task}.{split}")
            for k in range(2 if pair else 1):
                write_lines(f"{stem}.input{k}", [r[1 + k] for r in rows])
            if labels is None:  # STS-B: float targets beside the binarized inputs
                os.makedirs(os.path.join(dest, "label"), exist_ok=True)
                write_lines(os.path.join(dest, "label", f"{split}.label"),
                            [f"{0.2 + 0.3 * sum(r[0]) + rng.uniform(-0.1, 0.1):.4f}" for r in rows])
            elif pair:  # RTE: "entailment" when the second sentence leans positive
                write_lines(f"{stem}.label", [labels[0] if r[0][1] else labels[1] for r in rows])
            else:
                write_lines(f"{stem}.label", [labels[r[0]] for r in rows])
        pre = ["--only-source", "--workers", "1"]
        for k in range(2 if pair else 1):
            preprocess(pre + ["--trainpref", f"{raw}/{task}.train.input{k}", "--validpref",
                              f"{raw}/{task}.valid.input{k}", "--destdir", f"{dest}/input{k}", "--srcdict", dict_txt])
        meta = {"task": task, "regression": labels is None, "splits": {"train": "generated", "valid": "generated"}}
        if labels is None:
            meta.update(num_classes=1, target="score in [0, 1]")
        else:
            preprocess(pre + ["--trainpref", f"{raw}/{task}.train.label", "--validpref", f"{raw}/{task}.valid.label",
                              "--destdir", f"{dest}/label"])
            with open(os.path.join(dest, "label", "dict.txt")) as f:
                symbols = [line.split()[0] for line in f if line.strip()]
            id2label = {str(i): sym for i, sym in enumerate(symbols) if sym in labels}
            meta.update(num_classes=len(labels), id2label=id2label, label2id={v: int(k) for k, v in id2label.items()})
        with open(os.path.join(dest, "labels.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")


def start(argv, doc, arch, pretrain_updates, train_size, valid_size):
    """The tiny generators' command line: None after printing ``--arch-flags``, else (args, rng, out, raw)
    with OUT/raw made."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="output directory")
    ap.add_argument("--arch-flags", action="store_true",
                    help="print the tiny model's architecture flags (what a fairseq-train command on it repeats)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pretrain-updates", type=int, default=pretrain_updates)
    ap.add_argument("--train-size", type=int, default=train_size)
    ap.add_argument("--valid-size", type=int, default=valid_size)
    args = ap.parse_args(argv)
    if args.arch_flags:
        print(" ".join(arch))
        return None
    if not args.out:
        ap.error("the output directory is required")
    out = os.path.abspath(args.out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    return args, random.Random(args.seed), out, raw


def main(argv=None):
    started = start(argv, __doc__, TINY_ARCH, pretrain_updates=40, train_size=256, valid_size=64)
    if started is None:
        return
    args, rng, out, raw = started
    pos = [f"good{i}" for i in range(8)]
    neg = [f"bad{i}" for i in range(8)]
    vocab = [f"w{i}" for i in range(80)] + pos + neg

    write_lines(os.path.join(raw, "lm.train"), make_text(rng, vocab, 600))
    write_lines(os.path.join(raw, "lm.valid"), make_text(rng, vocab, 60))
    sizes = (("train", args.train_size), ("valid", args.valid_size))
    cls_raw = {}
    for split, n in sizes:
        cls_raw[split] = polar_sentences(rng, vocab, pos, neg, n)
        write_lines(os.path.join(raw, f"cls.{split}.input0"), [s for _, s in cls_raw[split]])
        write_lines(os.path.join(raw, f"cls.{split}.label"), [str(label) for label, _ in cls_raw[split]])

    pre = ["--only-source", "--workers", "1"]
    lm_bin = os.path.join(out, "lm-bin")
    preprocess(pre + ["--trainpref", f"{raw}/lm.train", "--validpref", f"{raw}/lm.valid", "--destdir", lm_bin])
    cls_bin = os.path.join(out, "cls-bin")
    preprocess(pre + ["--trainpref", f"{raw}/cls.train.input0", "--validpref", f"{raw}/cls.valid.input0",
                      "--destdir", f"{cls_bin}/input0", "--srcdict", f"{lm_bin}/dict.txt"])
    preprocess(pre + ["--trainpref", f"{raw}/cls.train.label", "--validpref", f"{raw}/cls.valid.label",
                      "--destdir", f"{cls_bin}/label"])
    write_glue(out, raw, random.Random(args.seed + 1), vocab, pos, neg, cls_raw, sizes)

    pretrain(out, args, [lm_bin, "--task", "masked_lm", "--criterion", "masked_lm", *TINY_ARCH,
                         "--tokens-per-sample", "64", "--batch-size", "16", "--lr", "5e-4", "--log-interval", "10"])


def pretrain(out, args, flags):
    """fairseq-train with ``flags`` (data, task, model, lr) and the tiny generators' common ones, on CPU;
    its last checkpoint becomes OUT/pretrained.pt."""
    save = os.path.join(out, "pretrain")
    run([sys.executable, "-m", "fairseq_cli.train", *flags, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
         "--lr-scheduler", "fixed", "--max-update", str(args.pretrain_updates), "--seed", str(args.seed),
         "--cpu", "--num-workers", "0", "--save-dir", save, "--no-epoch-checkpoints",
         "--disable-validation", "--log-format", "simple"],
        os.path.join(out, "pretrain.log"))
    os.replace(os.path.join(save, "checkpoint_last.pt"), os.path.join(out, "pretrained.pt"))
    print(os.path.join(out, "pretrained.pt"))

if __name__ == "__main__":
    main()
