"""Make a tiny "pretrained" translation model and a two-domain language pair, on CPU.

A rule-based language pair: the target is the source word for word, each ``wK`` written ``vK``.
Domain A (the "general" domain) draws its words from w0..w31, domain B (the new one) from
w16..w47: half of A's words never occur in B, which is where fine-tuning on B can forget A.

  OUT/a-bin/          domain A: train, valid (what the model was pretrained on)
  OUT/b-bin/          domain B: train, valid; test = domain A's dev set, the forgetting probe
                      (fine-tune with --valid-subset valid,test: BLEU on both domains)
  OUT/pretrained.pt   a tiny transformer (1+1 layers, dim 32, shared embeddings) trained on A

One joined dictionary for both domains and both sides, so every command reads the same symbols.
Used by the tests and by docs/seq2seq.md's tiny walk-through; not a translation benchmark.
"""

import os

from recadam_fairseq.tiny.make_tiny_roberta import preprocess, pretrain, start, write_lines

# The tiny model's flags; fine-tuning commands repeat them.
TINY_ARCH = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--max-source-positions", "64", "--max-target-positions", "64",
]
# fairseq's BART, as tiny: it shares the encoder's, the decoder's and the output embeddings (its arch sets
# --share-all-embeddings), which the joined dictionary allows. tests/test_seq2seq.py pretrains it briefly on A.
TINY_BART_ARCH = [
    "--arch", "bart_base", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-source-positions", "64",
    "--max-target-positions", "64",
]
LANGS = ["--source-lang", "src", "--target-lang", "tgt"]
DOMAINS = {"a": range(0, 32), "b": range(16, 48)}
VOCAB = 48


def sentence_pairs(rng, words, n, lo=3, hi=10):
    """n (source, target) lines: wK -> vK, word for word."""
    out = []
    for _ in range(n):
        src = [f"w{rng.choice(words)}" for _ in range(rng.randint(lo, hi))]
        out.append((" ".join(src), " ".join("v" + w[1:] for w in src)))
    return out


def main(argv=None):
    started = start(argv, __doc__, TINY_ARCH, pretrain_updates=150, train_size=512, valid_size=48)
    if started is None:
        return
    args, rng, out, raw = started
    # the joined dictionary, written once: every word of both sides, in a fixed order
    dict_txt = os.path.join(raw, "dict.txt")
    write_lines(dict_txt, [f"{p}{k} 1" for p in "wv" for k in range(VOCAB)])
    for dom, words in DOMAINS.items():
        for split, n in (("train", args.train_size), ("valid", args.valid_size)):
            pairs = sentence_pairs(rng, list(words), n)
            write_lines(os.path.join(raw, f"{dom}.{split}.src"), [s for s, _ in pairs])
            write_lines(os.path.join(raw, f"{dom}.{split}.tgt"), [t for _, t in pairs])
    pre = [*LANGS, "--srcdict", dict_txt, "--tgtdict", dict_txt, "--workers", "1"]
    preprocess(pre + ["--trainpref", f"{raw}/a.train", "--validpref", f"{raw}/a.valid",
                      "--destdir", os.path.join(out, "a-bin")])
    preprocess(pre + ["--trainpref", f"{raw}/b.train", "--validpref", f"{raw}/b.valid", "--testpref",
                      f"{raw}/a.valid", "--destdir", os.path.join(out, "b-bin")])

    pretrain(out, args, [os.path.join(out, "a-bin"), "--task", "translation", *LANGS, *TINY_ARCH,
                         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--lr", "1e-2",
                         "--dropout", "0.1", "--max-tokens", "1024", "--log-interval", "50"])

if __name__ == "__main__":
    main()
