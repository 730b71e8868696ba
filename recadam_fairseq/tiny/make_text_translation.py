"""A two-domain rule-based language pair over real English text, and a small transformer pretrained on one domain.

No parallel corpus and no pretrained translation model can be reached from here, so the "translation" is a
rule: every source word is written reversed and in capitals (``the film`` -> ``EHT MLIF``; punctuation stays),
word for word. The text is real: the two files of rated snippets that ``vaderSentiment==3.3.2``'s sdist ships
(the forgetting comparison's sdist, fetched or reused the same way: recadam_fairseq/tiny/text_data.py):

  domain A ("movie", the pretraining domain): rotten-tomatoes review snippets
  domain B ("tweets", the new domain): tweets

Each domain's text is lowercased and cut into words; its vocabulary is its ``--vocab`` most frequent words, and
its sentences are the runs of consecutive in-vocabulary words, cut into fragments of 3..12 words (real word
order, no unknown words). The two vocabularies overlap in the common words (the, a, and, ...) and differ in
the rest (film, story, comedy / lol, love, url, @): a model fine-tuned on B can forget how A's own words are
written, which BLEU on A's dev set measures.

  OUT/a-bin/          domain A: train, valid (what the model is pretrained on)
  OUT/b-bin/          domain B: train, valid; test = domain A's valid set (--valid-subset valid,test: BLEU on both)
  OUT/pretrained.pt   the transformer (ARCH) trained on A
  OUT/data.json       the sizes, the vocabularies' overlap, the sdist's name and digest

One joined dictionary for both domains and both sides. A synthetic setting: what it can show is stated in
docs/seq2seq-comparison.md.
"""

import argparse
import collections
import json
import os
import random
import re
import sys

from recadam_fairseq.tiny.make_tiny_roberta import preprocess, pretrain, write_lines
from recadam_fairseq.tiny.make_tiny_translation import LANGS

ARCH = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
    "--decoder-attention-heads", "4", "--max-source-positions", "64", "--max-target-positions", "64",
]
DOMAIN_FILES = {"a": "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
                "b": "hutto_ICWSM_2014/tweets_GroundTruth.txt"}
WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+|[^\sa-z0-9]")


def words(text):
    return WORD.findall(text.lower())


def translate(src_words):
    """The rule: each word reversed, in capitals."""
    return [w[::-1].upper() for w in src_words]


def fragments(texts, vocab, lo=3, hi=12):
    """Runs of consecutive in-vocabulary words, cut into pieces of lo..hi words (shorter runs dropped)."""
    out = []
    for t in texts:
        run = []
        for w in words(t) + [None]:
            if w is not None and w in vocab:
                run.append(w)
                continue
            while len(run) >= lo:
                out.append(run[:hi])
                run = run[hi:]
            run = []
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="output directory")
    ap.add_argument("--arch-flags", action="store_true", help="print the model's architecture flags")
    ap.add_argument("--sdist-dir", help="where vaderSentiment's sdist is (fetched there with pip when missing)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=250, help="each domain's vocabulary: its most frequent words")
    ap.add_argument("--train-size", type=int, default=3000, help="training fragments per domain")
    ap.add_argument("--valid-size", type=int, default=300, help="dev fragments per domain")
    ap.add_argument("--pretrain-updates", type=int, default=1500)
    ap.add_argument("--pretrain-lr", type=float, default=3e-3)
    return ap, ap.parse_args(argv)


def make_data(args, out, sdist):
    """The raw and binarized pair in OUT; returns data.json's facts."""
    from recadam_fairseq.tiny.text_data import read_snippets

    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    rng = random.Random(args.seed)
    vocabs, splits, info = {}, {}, {"domains": {}}
    for dom, member in DOMAIN_FILES.items():
        texts, _ = read_snippets(sdist, member)
        counts = collections.Counter(w for t in texts for w in words(t))
        # most frequent first, ties by the word: the same vocabulary on every machine
        vocabs[dom] = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:args.vocab]]
        frags = fragments(texts, set(vocabs[dom]))
        rng.shuffle(frags)
        need = args.train_size + args.valid_size
        if len(frags) < need:
            raise SystemExit(f"make_text_translation: domain {dom} has {len(frags)} fragments, {need} asked for")
        splits[dom] = {"valid": frags[:args.valid_size], "train": frags[args.valid_size:need]}
        info["domains"][dom] = {"source": member, "texts": len(texts), "fragments": len(frags),
                                "train": args.train_size, "valid": args.valid_size}
    shared = set(vocabs["a"]) & set(vocabs["b"])
    info["vocab"] = {"per_domain": args.vocab, "shared": len(shared), "a_only": len(set(vocabs["a"]) - shared),
                     "b_only": len(set(vocabs["b"]) - shared)}
    # how much of A's dev text is A-only words (what fine-tuning on B never sees)
    a_valid = [w for f in splits["a"]["valid"] for w in f]
    info["a_valid_words_not_in_b_vocab"] = round(sum(w not in vocabs["b"] for w in a_valid) / len(a_valid), 4)
    every = sorted(set(vocabs["a"]) | set(vocabs["b"]))
    dict_txt = os.path.join(raw, "dict.txt")
    write_lines(dict_txt, [f"{w} 1" for w in sorted(set(every) | set(translate(every)))])  # punctuation: once
    for dom, s in splits.items():
        for split, frags in s.items():
            write_lines(os.path.join(raw, f"{dom}.{split}.src"), [" ".join(f) for f in frags])
            write_lines(os.path.join(raw, f"{dom}.{split}.tgt"), [" ".join(translate(f)) for f in frags])
    pre = [*LANGS, "--srcdict", dict_txt, "--tgtdict", dict_txt, "--workers", "1"]
    preprocess(pre + ["--trainpref", f"{raw}/a.train", "--validpref", f"{raw}/a.valid",
                      "--destdir", os.path.join(out, "a-bin")])
    preprocess(pre + ["--trainpref", f"{raw}/b.train", "--validpref", f"{raw}/b.valid", "--testpref",
                      f"{raw}/a.valid", "--destdir", os.path.join(out, "b-bin")])
    return info


def main(argv=None):
    ap, args = parse_args(argv)
    if args.arch_flags:
        print(" ".join(ARCH))
        return 0
    if not args.out:
        ap.error("the output directory is required")
    from recadam_fairseq.tiny.text_data import fetch_vader

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    sdist = fetch_vader(args.sdist_dir or os.path.join(out, "sdists"))
    info = make_data(args, out, sdist)
    info.update({"sdist": os.path.basename(sdist), "seed": args.seed, "arch": ARCH,
                 "pretrain_updates": args.pretrain_updates, "pretrain_lr": args.pretrain_lr})
    pretrain(out, args, [os.path.join(out, "a-bin"), "--task", "translation", *LANGS, *ARCH,
                         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                         "--lr", str(args.pretrain_lr), "--dropout", "0.1", "--max-tokens", "2048",
                         "--log-interval", "100"])
    with open(os.path.join(out, "data.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
