"""Binarize the GLUE tasks for fairseq's ``sentence_prediction`` task (RoBERTa GPT-2 BPE).

A checked, in-process port of fairseq's ``examples/roberta/preprocess_GLUE_tasks.sh``:
same columns per task, same BPE (fairseq's GPT-2 encoder, ids as ``multiprocessing_bpe_encoder
--keep-empty`` writes them), same ``fairseq-preprocess`` calls, same output layout.  Unlike the
shell recipe it validates every row and stops with ``FILE, line N: ...`` instead of binarizing
garbage, and it reports what it skipped.

Usage::

    python data-prep/prepare_glue.py --glue-dir glue_data --bpe-dir gpt2_bpe --out glue-bin \\
        [--tasks CoLA RTE ... | ALL] [--workers N] [--stsb-raw-scores] [--download]

``--glue-dir`` holds ``<TASK>/train.tsv`` and ``<TASK>/dev.tsv`` (MNLI: ``dev_matched.tsv``,
``dev_mismatched.tsv``) as the standard ``download_glue_data.py`` lays them out; ``--bpe-dir``
holds ``encoder.json``, ``vocab.bpe`` and ``dict.txt``.  ``--download`` fetches whatever of
those is missing (needs network); everything else works offline.  Output, per task::

    <OUT>/<TASK>-bin/input0/{train,valid}.{bin,idx}, dict.txt   first sentence
    <OUT>/<TASK>-bin/input1/...                                 second sentence (pair tasks only)
    <OUT>/<TASK>-bin/label/{train,valid}.{bin,idx}, dict.txt    classification labels
    <OUT>/<TASK>-bin/label/{train,valid}.label                  STS-B only: float targets
    <OUT>/<TASK>-bin/labels.json                                label id -> name, num_classes

MNLI's dev_matched becomes ``valid`` and dev_mismatched ``valid1`` (the recipe's
``--validpref matched,mismatched``).  STS-B scores are divided by 5 as in the recipe
(``--stsb-raw-scores`` keeps 0..5).  Test splits are not processed (GLUE hides their labels).

Bad input stops the run (exit 1) naming file and line: a missing file, a row with the wrong
number of columns, an unknown label, a dev label never seen in train, an empty split.  Only QQP
tolerates rows with the wrong column count -- the official file has a few broken ones and the
recipe drops them too (``awk NF==6``); they are skipped, counted and listed in the report.
"""

import argparse
import contextlib
import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from recadam_fairseq.core import glue_tasks  # (pure Python)
from recadam_fairseq.core.glue_tasks import GlueTask as Task


class PrepError(Exception):
    """Bad input or environment; main() prints it and exits 1."""


# The GLUE tasks' columns, labels and dev files: recadam_fairseq/core/glue_tasks.py (one table for the
# task, the criterion, this script and the GLUE scripts).
TASKS = glue_tasks.TASKS
BPE_FILES = ("encoder.json", "vocab.bpe", "dict.txt")
STSB_MAX = 5.0

# Public locations, as in the well-known download_glue_data.py gist and the fairseq recipe.
GLUE_ZIPS = {
    "CoLA": "https://dl.fbaipublicfiles.com/glue/data/CoLA.zip",
    "SST-2": "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip",
    "QQP": "https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip",
    "STS-B": "https://dl.fbaipublicfiles.com/glue/data/STS-B.zip",
    "MNLI": "https://dl.fbaipublicfiles.com/glue/data/MNLI.zip",
    "QNLI": "https://dl.fbaipublicfiles.com/glue/data/QNLIv2.zip",
    "RTE": "https://dl.fbaipublicfiles.com/glue/data/RTE.zip",
    "WNLI": "https://dl.fbaipublicfiles.com/glue/data/WNLI.zip",
}
MRPC_TRAIN = "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt"
MRPC_DEV_IDS = ("https://raw.githubusercontent.com/MegEngine/Models/master/official/nlp/bert/"
                "glue_data/MRPC/dev_ids.tsv")
BPE_URL = "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/{}"


# ----------------------------------------------------------------------------- reading


@dataclass
class Split:
    file: str  # source TSV
    name: str  # fairseq split: train, valid, valid1
    texts: List[List[str]]  # per input column
    labels: List[str]
    linenos: List[int]
    rows_read: int = 0
    skipped: Dict[str, List[int]] = field(default_factory=lambda: defaultdict(list))


def read_split(task: Task, path: str, name: str, columns: int) -> Split:
    if not os.path.isfile(path):
        raise PrepError(f"{path}: missing {task.name} file")
    split = Split(path, name, [[] for _ in task.text_cols], [], [])
    # Binary + per-line decode: lines end at b"\n" only (a stray \r or U+2028 inside a sentence
    # must not split a row) and decode errors get a line number.
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}, line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PrepError(f"{where}: not UTF-8 ({e.reason})") from None
            if lineno == 1:
                line = line.lstrip("\ufeff")  # MRPC's files start with a BOM
            fields = line.rstrip("\r\n").split("\t")  # no csv quoting: GLUE text has bare quotes
            if lineno == 1 and task.header:
                if len(fields) != columns:
                    raise PrepError(f"{where}: header has {len(fields)} columns, expected {columns}")
                continue
            split.rows_read += 1
            if len(fields) != columns:
                problem = f"expected {columns} tab-separated columns, got {len(fields)}"
                if task.skip_malformed:
                    split.skipped[problem].append(lineno)
                    continue
                raise PrepError(f"{where}: {problem}")
            label = fields[task.label_col].strip()
            check_label(task, label, where)
            for k, col in enumerate(task.text_cols):
                split.texts[k].append(fields[col])
            split.labels.append(label)
            split.linenos.append(lineno)
    if not split.labels:
        raise PrepError(f"{path}: empty split, no examples"
                        + (f" ({split.rows_read} rows read, all skipped)" if split.rows_read else ""))
    return split


def check_label(task: Task, label: str, where: str):
    if task.labels is not None:
        if label not in task.labels:
            raise PrepError(f"{where}: unknown {task.name} label {label!r}, expected one of {list(task.labels)}")
        return
    try:
        score = float(label)
    except ValueError:
        score = math.nan
    if not 0.0 <= score <= STSB_MAX:  # also catches nan
        raise PrepError(f"{where}: {task.name} score {label!r} is not a number in [0, {STSB_MAX:g}]")


def read_task(task: Task, glue_dir: str) -> List[Split]:
    tdir = os.path.join(glue_dir, task.name)
    splits = [read_split(task, os.path.join(tdir, "train.tsv"), "train", task.columns)]
    for k, fname in enumerate(task.dev_files):
        splits.append(read_split(task, os.path.join(tdir, fname), "valid" + (str(k) if k else ""),
                                 task.dev_columns or task.columns))
    if task.labels is not None:
        # fairseq-preprocess builds the label dictionary from train only: a dev-only label would
        # silently become <unk> (target -1).
        seen = set(splits[0].labels)
        for s in splits[1:]:
            for label, lineno in zip(s.labels, s.linenos):
                if label not in seen:
                    raise PrepError(f"{s.file}, line {lineno}: label {label!r} never occurs in "
                                    f"{splits[0].file}, so fairseq's label dictionary would lack it")
    return splits


# ----------------------------------------------------------------------------- BPE + binarize

_bpe, _bpe_paths = None, None
POOL_MIN_LINES = 1000  # below this a process pool costs more than it saves


def _init_bpe(encoder_json, vocab_bpe):
    global _bpe, _bpe_paths
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    _bpe, _bpe_paths = get_encoder(encoder_json, vocab_bpe), (encoder_json, vocab_bpe)


def _encode(text):
    # as multiprocessing_bpe_encoder: strip, encode, space-separated ids (empty kept as empty)
    return " ".join(map(str, _bpe.encode(text.strip())))


def bpe_encode(texts: List[str], bpe_dir: str, workers: int) -> List[str]:
    paths = (os.path.join(bpe_dir, "encoder.json"), os.path.join(bpe_dir, "vocab.bpe"))
    if workers <= 1 or len(texts) < POOL_MIN_LINES:
        if _bpe_paths != paths:
            _init_bpe(*paths)
        return [_encode(t) for t in texts]
    # fork: the worker functions live in this file, which spawn could not re-import by name
    with multiprocessing.get_context("fork").Pool(workers, _init_bpe, paths) as pool:
        return pool.map(_encode, texts, chunksize=500)


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def fairseq_preprocess(argv: List[str]):
    """Run fairseq-preprocess in-process."""
    from fairseq import options
    from fairseq_cli import preprocess

    # preprocess.main() adds a FileHandler to its module logger on every call and never removes
    # it: without cleanup each later task would also log into every earlier preprocess.log.
    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    log.propagate = False  # its chatter (an argument dump per call) goes to <dest>/preprocess.log only
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    finally:
        log.propagate = True
        for h in log.handlers[:]:
            if h not in before:
                log.removeHandler(h)
                h.close()


def num_binarized(prefix: str) -> int:
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return len(MMapIndexedDataset(prefix))


@contextlib.contextmanager
def building(out_dir: str, name: str):
    """(processed, dest, final): a work directory beside OUT/NAME-bin (``final``), its text files' folder and the
    binarized task's (with ``label/``), removed at the end: a failed run leaves no half-made task directory."""
    final = os.path.join(out_dir, f"{name}-bin")
    work = tempfile.mkdtemp(prefix=f".{name}-", dir=out_dir)
    try:
        proc, dest = os.path.join(work, "processed"), os.path.join(work, "bin")
        os.makedirs(proc)
        os.makedirs(os.path.join(dest, "label"))
        yield proc, dest, final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def finish(dest: str, final: str, meta: dict, examples: Dict[Tuple[str, str], int]) -> None:
    """DEST/labels.json (``meta``), then each binarized kind/split's count against ``examples`` (what was read: a cheap
    check of what fairseq wrote), then DEST in FINAL's place (a half-made task directory never stands there)."""
    with open(os.path.join(dest, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for (kind, split), want in examples.items():
        n = num_binarized(os.path.join(dest, kind, split))
        if n != want:
            raise PrepError(f"{meta['task']}: {kind}/{split} has {n} examples, expected {want}")
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(dest, final)


def build_task(task: Task, splits: List[Split], bpe_dir: str, out_dir: str, workers: int,
               stsb_raw: bool) -> dict:
    """Write <out_dir>/<TASK>-bin; return the summary facts for the report."""
    with building(out_dir, task.name) as (proc, dest, final):
        with open(os.path.join(bpe_dir, "dict.txt"), encoding="utf-8") as f:
            known = {line.split(maxsplit=1)[0] for line in f if line.strip()}
        not_in_dict = 0
        for s in splits:
            for k, texts in enumerate(s.texts):
                enc = bpe_encode(texts, bpe_dir, workers)
                not_in_dict += sum(tok not in known for line in enc for tok in line.split())
                write_lines(os.path.join(proc, f"{s.name}.input{k}"), enc)
            write_lines(os.path.join(proc, f"{s.name}.label"), s.labels)

        def prefs(kind):
            return (os.path.join(proc, f"train.{kind}"),
                    ",".join(os.path.join(proc, f"{s.name}.{kind}") for s in splits[1:]))

        for k in range(len(task.text_cols)):
            train, valid = prefs(f"input{k}")
            fairseq_preprocess(["--only-source", "--trainpref", train, "--validpref", valid,
                                "--destdir", os.path.join(dest, f"input{k}"), "--workers", str(workers),
                                "--srcdict", os.path.join(bpe_dir, "dict.txt")])
        meta = {"task": task.name, "regression": task.labels is None,
                "splits": {s.name: os.path.basename(s.file) for s in splits}}
        if task.labels is not None:
            train, valid = prefs("label")
            fairseq_preprocess(["--only-source", "--trainpref", train, "--validpref", valid,
                                "--destdir", os.path.join(dest, "label"), "--workers", str(workers)])
            # Line i of label/dict.txt is target id i (sentence_prediction subtracts nspecial);
            # skip the madeupword padding fairseq appends.
            with open(os.path.join(dest, "label", "dict.txt"), encoding="utf-8") as f:
                symbols = [line.split()[0] for line in f if line.strip()]
            id2label = {str(i): sym for i, sym in enumerate(symbols) if sym in task.labels}
            meta.update(num_classes=len(task.labels), id2label=id2label,
                        label2id={v: int(k) for k, v in id2label.items()})
            if task.meaning:
                meta["label_meaning"] = task.meaning
        else:
            scale = 1.0 if stsb_raw else STSB_MAX
            for s in splits:
                write_lines(os.path.join(dest, "label", f"{s.name}.label"),
                            [repr(float(x) / scale) for x in s.labels])
            meta.update(num_classes=1, target=f"score / {scale:g}",
                        note="regression: use --regression-target --num-classes 1")
        kinds = [f"input{k}" for k in range(len(task.text_cols))] + (["label"] if task.labels else [])
        finish(dest, final, meta, {(kind, s.name): len(s.labels) for s in splits for kind in kinds})
    return dict(meta, out=final, not_in_dict=not_in_dict)


# ----------------------------------------------------------------------------- download


def fetch(url: str, dest: str):
    print(f"downloading {url}", flush=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(dest + ".part", "wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:  # URLError, timeouts, refused connections, a full disk
        if os.path.exists(dest + ".part"):
            os.remove(dest + ".part")
        hint = (" No network here? Fetch the files elsewhere and pass --glue-dir/--bpe-dir"
                " (see data-prep/README.md)." if isinstance(e, (urllib.error.URLError, TimeoutError)) else "")
        raise PrepError(f"--download could not fetch {url}: {getattr(e, 'reason', e)}.{hint}") from None
    os.replace(dest + ".part", dest)


def download(tasks: List[Task], glue_dir: str, bpe_dir: str):
    """Fetch what is missing: BPE files, and each task's dir laid out as download_glue_data.py does."""
    os.makedirs(bpe_dir, exist_ok=True)
    for name in BPE_FILES:
        if not os.path.isfile(os.path.join(bpe_dir, name)):
            fetch(BPE_URL.format(name), os.path.join(bpe_dir, name))
    for task in tasks:
        tdir = os.path.join(glue_dir, task.name)
        if all(os.path.isfile(os.path.join(tdir, f)) for f in ("train.tsv",) + task.dev_files):
            continue
        os.makedirs(tdir, exist_ok=True)
        if task.name == "MRPC":
            download_mrpc(tdir)
            continue
        archive = os.path.join(glue_dir, os.path.basename(GLUE_ZIPS[task.name]))
        fetch(GLUE_ZIPS[task.name], archive)
        with zipfile.ZipFile(archive) as z:
            z.extractall(glue_dir)  # archives hold <TASK>/... (QQP-clean.zip -> QQP/, QNLIv2 -> QNLI/)
        os.remove(archive)


def download_mrpc(tdir: str):
    # GLUE does not host MRPC: split SentEval's copy of the MSR train file by the standard dev ids.
    train_txt, ids_tsv = os.path.join(tdir, "msr_paraphrase_train.txt"), os.path.join(tdir, "dev_ids.tsv")
    fetch(MRPC_TRAIN, train_txt)
    fetch(MRPC_DEV_IDS, ids_tsv)
    with open(ids_tsv, encoding="utf-8") as f:
        dev_ids = {tuple(line.strip().split("\t")) for line in f if line.strip()}
    with open(train_txt, encoding="utf-8-sig") as src, \
            open(os.path.join(tdir, "train.tsv"), "w", encoding="utf-8") as train, \
            open(os.path.join(tdir, "dev.tsv"), "w", encoding="utf-8") as dev:
        header = src.readline()
        train.write(header)
        dev.write(header)
        for line in src:
            fields = line.rstrip("\r\n").split("\t")
            (dev if tuple(fields[1:3]) in dev_ids else train).write("\t".join(fields) + "\n")


# ----------------------------------------------------------------------------- CLI


def parse_tasks(names: List[str]) -> List[Task]:
    if any(n.upper() == "ALL" for n in names):
        return list(TASKS.values())
    by_lower = {k.lower(): v for k, v in TASKS.items()}
    out = []
    for n in names:
        if n.lower() not in by_lower:
            raise PrepError(f"unknown task {n!r}; choose from {', '.join(TASKS)} or ALL")
        if by_lower[n.lower()] not in out:
            out.append(by_lower[n.lower()])
    return out


def report(task: Task, splits: List[Split], facts: dict) -> str:
    kind = "sentence pair" if len(task.text_cols) == 2 else "single sentence"
    lines = [f"{task.name}: {kind}, {facts['num_classes']} {'target' if facts['regression'] else 'classes'}"
             f" -> {facts['out']}"]
    for s in splits:
        skipped = sum(len(v) for v in s.skipped.values())
        lines.append(f"  {s.name:<7} {len(s.labels):>7} examples from {os.path.basename(s.file)}"
                     f" ({s.rows_read} rows read, {skipped} skipped)")
        for problem, linenos in s.skipped.items():
            shown = ", ".join(map(str, linenos[:10])) + (", ..." if len(linenos) > 10 else "")
            lines.append(f"          skipped {len(linenos)} x {problem}: lines {shown}")
    if facts["regression"]:
        lines.append(f"  targets: {facts['target']} (label/<split>.label)")
    else:
        counts = Counter(splits[0].labels)
        lines.append("  labels: " + ", ".join(
            f"{i}={name!r} (" + (f"{task.meaning[name]}, " if name in task.meaning else "")
            + f"{counts[name]} in train)" for i, name in facts["id2label"].items()))
    if facts["not_in_dict"]:
        lines.append(f"  warning: {facts['not_in_dict']} BPE tokens are not in dict.txt and became <unk>")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--glue-dir", required=True, help="GLUE data: <DIR>/<TASK>/train.tsv, dev.tsv")
    p.add_argument("--bpe-dir", required=True, help="encoder.json, vocab.bpe, dict.txt")
    p.add_argument("--out", required=True, help="writes <OUT>/<TASK>-bin")
    p.add_argument("--tasks", nargs="+", default=["ALL"], help=f"{' '.join(TASKS)} or ALL (default)")
    p.add_argument("--workers", type=int, default=1, help="processes for BPE and fairseq-preprocess")
    p.add_argument("--stsb-raw-scores", action="store_true",
                   help="keep STS-B scores in 0..5 (default: /5 like fairseq's recipe)")
    p.add_argument("--download", action="store_true", help="fetch missing GLUE/BPE files (needs network)")
    args = p.parse_args(argv)
    try:
        tasks = parse_tasks(args.tasks)
        if args.download:
            download(tasks, args.glue_dir, args.bpe_dir)
        for name in BPE_FILES:
            if not os.path.isfile(os.path.join(args.bpe_dir, name)):
                raise PrepError(f"{os.path.join(args.bpe_dir, name)}: missing BPE file (or use --download)")
        # Fail on a missing file before spending time on the tasks before it.
        for task in tasks:
            for fname in ("train.tsv",) + task.dev_files:
                path = os.path.join(args.glue_dir, task.name, fname)
                if not os.path.isfile(path):
                    raise PrepError(f"{path}: missing {task.name} file (or use --download)")
        os.makedirs(args.out, exist_ok=True)
        reports = []
        for task in tasks:
            print(f"== {task.name}", flush=True)
            splits = read_task(task, args.glue_dir)
            facts = build_task(task, splits, args.bpe_dir, args.out, max(1, args.workers),
                               args.stsb_raw_scores)
            reports.append(report(task, splits, facts))
    except PrepError as e:
        print(f"prepare_glue: error: {e}", file=sys.stderr)
        return 1
    print("\n== summary\n" + "\n".join(reports), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
