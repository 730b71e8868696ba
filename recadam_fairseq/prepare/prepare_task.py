"""A labelled file of yours for a converted model: tokenized by the model's own tokenizer, binarized for fairseq's
``sentence_prediction``, under your task's own name.

    python data-prep/prepare_task.py --model MODEL_DIR --task-name Reviews --train train.tsv --valid dev.tsv \\
        --text-column text --label-column label --out DATA_DIR

``MODEL_DIR`` is a directory of data-prep/convert_hf_to_fairseq.py (``dict.txt``, ``tokenizer.json``,
``arch.json``). ``--train`` and ``--valid`` (and ``--test``) are TSV, CSV, JSONL or Parquet files (by their extension,
or ``--format``) with a header row (JSONL: each line an object; Parquet: its columns, read by pyarrow, the
``parquet`` extra: what the datasets library writes) naming the columns: ``--text-column`` (and
``--text2-column`` for sentence pairs) and ``--label-column``, labels as words or numbers (``--regression``: a
number to predict). ``DATA_DIR/NAME-bin/`` gets fairseq-preprocess's layout (``input0/``, ``input1/`` for pairs,
``label/``; a regression's ``label/<split>.label``) and ``labels.json``: the task's name, its classes (``id2label``:
target id -> your label), the metric (``--metric``: accuracy by default, f1 and mcc for two classes; pearson for a
regression) and what the preparation counted. The task scripts (``finetune.sh NAME METHOD``), ``glue_multitask``
and ``summarize.py`` read it.

Each text is tokenized by the model's tokenizer without padding or special tokens (fairseq adds ``<s>`` and
``</s>``), cut to the model's positions (``arch.json``'s --max-positions, less the specials; pairs: the longer
text first), and written as its tokens for ``fairseq-preprocess --srcdict MODEL_DIR/dict.txt``. The report counts
the examples cut and the tokens that became ``<unk>``; more than ``--max-unk`` of them (5%) stops in one line: the
tokenizer does not fit the text (or the model). Bad input (a file without a header, a missing column, a label
column with one value, a valid label the train split lacks, a label that is not a number under --regression) is
one line naming the file; nothing is written until every split is read, and a failed run leaves no ``NAME-bin``.
"""

import argparse
import csv
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from recadam_fairseq.prepare.prepare_glue import PrepError, building, fairseq_preprocess, finish, write_lines

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
SEPARATORS = {"tsv": "\t", "csv": ","}
SPECIALS = 2  # <s> before, </s> after: what fairseq adds to a text
PAIR_SPECIALS = 4  # <s> A </s> </s> B </s> (sentence_prediction's --separator-token 2)
METRICS = {"accuracy": "classification", "f1": "two classes", "mcc": "two classes", "pearson": "regression"}
MAX_UNK = 0.05


@dataclass
class Split:
    name: str  # train, valid, test
    path: str
    texts: List[List[str]] = field(default_factory=list)  # per text column, one string an example
    labels: List[str] = field(default_factory=list)


def file_format(path: str, given: Optional[str]) -> str:
    if given:
        return given
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise PrepError(f"{path}: cannot tell its format from the extension {ext or '(none)'}: give --format "
                        f"{' or '.join(sorted(set(FORMATS.values())))}")
    return FORMATS[ext]


def read_rows(path: str, fmt: str, columns: List[str]) -> List[Dict[str, str]]:
    """The file's rows as {column: text} for ``columns``; a missing file, header or column is a PrepError."""
    if not os.path.isfile(path):
        raise PrepError(f"{path}: no such file")
    if fmt == "parquet":
        return parquet_rows(path, columns)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            if fmt == "jsonl":
                rows = []
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except ValueError as e:
                        raise PrepError(f"{path}, line {n}: not JSON ({e})") from None
                    if not isinstance(row, dict):
                        raise PrepError(f"{path}, line {n}: a JSON object per line is expected, got "
                                        f"{type(row).__name__}")
                    missing = [c for c in columns if c not in row]
                    if missing:
                        raise PrepError(f"{path}, line {n}: no {', '.join(map(repr, missing))} (its keys: "
                                        f"{', '.join(map(repr, row))})")
                    rows.append({c: "" if row[c] is None else str(row[c]) for c in columns})
                return rows
            reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",",
                                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
            header = next(reader, None)
            if not header:
                raise PrepError(f"{path}: empty")
            missing = [c for c in columns if c not in header]
            if missing:
                shown = SEPARATORS[fmt].join(header)
                other = "csv" if fmt == "tsv" else "tsv"
                if len(header) == 1 and all(c in header[0].split(SEPARATORS[other]) for c in columns):
                    raise PrepError(f"{path}: its header row is one column, {shown[:120]!r}: the separator looks "
                                    f"like a {'comma' if other == 'csv' else 'tab'}, not a "
                                    f"{'tab' if fmt == 'tsv' else 'comma'}: give --format {other}")
                raise PrepError(f"{path}: no column {', '.join(map(repr, missing))} in its header row "
                                f"({shown[:120]!r}); the file needs a header row naming its columns")
            where = [header.index(c) for c in columns]
            rows = []
            for cells in reader:
                if not cells:
                    continue
                if len(cells) != len(header):  # (line_num: the file's line, also after a quoted newline)
                    raise PrepError(f"{path}, line {reader.line_num}: {len(cells)} columns, the header has "
                                    f"{len(header)}")
                rows.append({c: cells[i] for c, i in zip(columns, where)})
            return rows
    except UnicodeDecodeError as e:
        raise PrepError(f"{path}: not UTF-8 ({e})") from None


def parquet_rows(path: str, columns: List[str]) -> List[Dict[str, str]]:
    """A Parquet file's rows as {column: text} for ``columns`` (numbers as Python writes them, as a CSV holds them;
    None as empty); a missing column or a nested one is a PrepError."""
    try:
        import pyarrow.parquet as pq
        import pyarrow.types as pt
    except ImportError:
        raise PrepError(f"{path}: reading Parquet needs pyarrow: pip install 'recadam-fairseq[parquet]' (make "
                        f"installs it)") from None
    try:
        schema = pq.read_schema(path)
    except Exception as e:  # noqa: BLE001 - pyarrow's own words, one line
        raise PrepError(f"{path}: not a Parquet file ({str(e).splitlines()[0][:200]})") from None
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise PrepError(f"{path}: no column {', '.join(map(repr, missing))} among its columns "
                        f"({', '.join(schema.names)[:120]})")
    for c in columns:
        t = schema.field(c).type
        if not (pt.is_string(t) or pt.is_large_string(t) or pt.is_integer(t) or pt.is_floating(t)
                or pt.is_boolean(t) or pt.is_dictionary(t)):
            raise PrepError(f"{path}: column {c!r} is of type {t}: a text or a number is expected")
    table = pq.read_table(path, columns=list(dict.fromkeys(columns)))
    values = {c: table.column(c).to_pylist() for c in dict.fromkeys(columns)}
    return [{c: "" if values[c][i] is None else str(values[c][i]) for c in columns} for i in range(table.num_rows)]


def read_split(name: str, path: str, fmt: str, text_columns: List[str], label_column: str) -> Split:
    rows = read_rows(path, fmt, text_columns + [label_column])
    if not rows:
        raise PrepError(f"{path}: no examples")
    s = Split(name, path)
    s.texts = [[r[c] for r in rows] for c in text_columns]
    s.labels = [r[label_column].strip() for r in rows]
    return s


def label_order(labels: List[str]) -> List[str]:
    """The classes in target-id order: numbers by value when every label is one, else as strings."""
    names = sorted(set(labels))
    try:
        return sorted(names, key=float)
    except ValueError:
        return names


class Tokens:
    """The model's tokenizer (tokenizer.json through the tokenizers library), its pieces as dict.txt's symbols."""

    def __init__(self, model_dir: str):
        from tokenizers import Tokenizer

        from recadam_fairseq.prepare.hf_source import BERT_SPECIALS

        for name in ("tokenizer.json", "dict.txt", "arch.json"):
            if not os.path.isfile(os.path.join(model_dir, name)):
                raise PrepError(f"--model {model_dir}: no {name} (a directory of data-prep/convert_hf_to_fairseq.py)")
        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.tok.no_padding()  # a sentence-embedding tokenizer may pad to a fixed length (MiniLM's: 128)
        self.tok.no_truncation()
        with open(os.path.join(model_dir, "dict.txt"), encoding="utf-8") as f:
            self.known = {line.split(maxsplit=1)[0] for line in f if line.strip()}
        with open(os.path.join(model_dir, "arch.json"), encoding="utf-8") as f:
            arch = json.load(f)["arch_args"]
        self.max_positions = int(arch[arch.index("--max-positions") + 1])
        self.unk = set(BERT_SPECIALS[3:]) | {"<unk>"}

    def pieces(self, texts: List[str]) -> List[List[str]]:
        return [e.tokens for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def unknown(self, piece: str) -> bool:
        """A piece fairseq-preprocess writes as <unk>: the tokenizer's own, or one dict.txt lacks."""
        return piece in self.unk or piece not in self.known

    def lines(self, texts: List[str], where: str, max_unk: float = MAX_UNK) -> List[str]:
        """``texts`` as lines of pieces for fairseq-preprocess --srcdict dict.txt; PrepError when more than
        ``max_unk`` of the pieces are <unk>."""
        pieces = self.pieces(texts)
        n = sum(len(p) for p in pieces)
        check_unk(n, sum(self.unknown(x) for p in pieces for x in p), max_unk, where)
        return [" ".join(p) for p in pieces]


def check_unk(tokens: int, unk: int, max_unk: float, where: str) -> None:
    if tokens == 0:
        raise PrepError(f"{where}: its texts give no tokens (empty text columns?)")
    if unk > max_unk * tokens:
        raise PrepError(f"{where}: {100 * unk / tokens:.1f}% of its {tokens:,} tokens are <unk> (more than --max-unk "
                        f"{100 * max_unk:g}%): the model's tokenizer does not fit this text (another language or "
                        f"script, or the wrong --model)")


def cut(a: List[str], b: Optional[List[str]], room: int):
    """The pieces cut to ``room`` tokens in all, the longer text first (Hugging Face's longest_first)."""
    if b is None:
        return a[:room], None
    a, b = list(a), list(b)
    while len(a) + len(b) > room:
        (a if len(a) >= len(b) else b).pop()
    return a, b


def tokenize(splits: List[Split], tokens: Tokens, max_unk: float) -> Dict[str, Dict[str, int]]:
    """Each split's texts as space-joined pieces, in place; returns per split {examples, cut, tokens, unk}."""
    pair = len(splits[0].texts) == 2
    room = tokens.max_positions - (PAIR_SPECIALS if pair else SPECIALS)
    facts = {}
    for s in splits:
        cols = [tokens.pieces(texts) for texts in s.texts]
        n_cut = n_tok = n_unk = 0
        out = [[] for _ in cols]
        for i in range(len(s.labels)):
            a, b = cols[0][i], cols[1][i] if pair else None
            ca, cb = cut(a, b, room)
            n_cut += (len(ca) + (len(cb) if pair else 0)) < (len(a) + (len(b) if pair else 0))
            for k, piece in enumerate((ca, cb) if pair else (ca,)):
                n_tok += len(piece)
                n_unk += sum(map(tokens.unknown, piece))
                out[k].append(" ".join(piece))
        check_unk(n_tok, n_unk, max_unk, s.path)
        s.texts = out
        facts[s.name] = {"examples": len(s.labels), "cut": n_cut, "tokens": n_tok, "unk": n_unk}
    return facts


def check_labels(splits: List[Split], label_column: str, regression: bool, metric: str) -> List[str]:
    """The classes (none for a regression); PrepError for what cannot train."""
    train = splits[0]
    for s in splits:  # an empty label would be a class named "" (and an empty target) or no number
        blank = next((n for n, y in enumerate(s.labels, 1) if not y), None)  # (labels are stripped)
        if blank is not None:
            raise PrepError(f"{s.path}: example {blank}: column {label_column!r} is empty (every example needs a label)")
    if regression:
        for s in splits:
            for n, y in enumerate(s.labels, 2):
                try:
                    v = float(y)
                except ValueError:
                    v = math.nan
                if not math.isfinite(v):
                    raise PrepError(f"{s.path}: example {n - 1}: {label_column} {y!r} is not a finite number "
                                    f"(--regression)")
        if len({float(y) for y in train.labels}) < 2:
            raise PrepError(f"{train.path}: column {label_column!r} has one value in every example: nothing to "
                            f"regress on (pearson and spearman are undefined)")
        return []
    classes = label_order(train.labels)
    if len(classes) < 2:
        raise PrepError(f"{train.path}: column {label_column!r} has one value ({classes[0]!r}) in every example: "
                        f"nothing to classify (a number to predict: --regression)")
    for s in splits[1:]:
        unseen = sorted(set(s.labels) - set(classes))
        if unseen:
            raise PrepError(f"{s.path}: label(s) {', '.join(map(repr, unseen[:5]))} of column {label_column!r} "
                            f"never occur in {train.path}")
    if metric in ("f1", "mcc") and len(classes) != 2:
        raise PrepError(f"--metric {metric}: for two classes; {train.path} has {len(classes)}")
    symbols = {}
    for c in classes:
        if symbols.setdefault(symbol(c), c) != c:
            raise PrepError(f"{train.path}: labels {symbols[symbol(c)]!r} and {c!r} differ only in whitespace")
    return classes


def symbol(label: str) -> str:
    """A label as a symbol of fairseq's label dictionary (which splits on whitespace): its words joined by _."""
    return "_".join(label.split())


def build(splits: List[Split], classes: List[str], out_dir: str, name: str, model_dir: str, metric: str,
          facts: dict, columns: dict) -> dict:
    """Write OUT/NAME-bin (built beside it, swapped in at the end); return labels.json's content."""
    os.makedirs(out_dir, exist_ok=True)
    with building(out_dir, name) as (proc, dest, final):
        label_dict = os.path.join(proc, "label.dict.txt")  # target id i: classes[i]
        for s in splits:
            for k, texts in enumerate(s.texts):
                write_lines(os.path.join(proc, f"{s.name}.input{k}"), texts)
            write_lines(os.path.join(proc, f"{s.name}.label"), [symbol(y) for y in s.labels])

        def prefs(kind):
            out = ["--trainpref", os.path.join(proc, f"train.{kind}"),
                   "--validpref", os.path.join(proc, f"valid.{kind}")]
            if any(s.name == "test" for s in splits):
                out += ["--testpref", os.path.join(proc, f"test.{kind}")]
            return out

        for k in range(len(splits[0].texts)):
            fairseq_preprocess(["--only-source", *prefs(f"input{k}"), "--destdir", os.path.join(dest, f"input{k}"),
                                "--workers", "1", "--srcdict", os.path.join(model_dir, "dict.txt")])
        meta = {"task": name, "regression": not classes, "metric": metric,
                "model": os.path.abspath(model_dir), "columns": columns,
                "splits": {s.name: os.path.abspath(s.path) for s in splits}, "prepared": facts}
        if classes:
            counts = {c: splits[0].labels.count(c) for c in classes}
            write_lines(label_dict, [f"{symbol(c)} {counts[c]}" for c in classes])
            fairseq_preprocess(["--only-source", *prefs("label"), "--destdir", os.path.join(dest, "label"),
                                "--workers", "1", "--srcdict", label_dict])
            meta.update(num_classes=len(classes), id2label={str(i): c for i, c in enumerate(classes)},
                        label2id={c: i for i, c in enumerate(classes)})
        else:
            for s in splits:
                write_lines(os.path.join(dest, "label", f"{s.name}.label"), [repr(float(y)) for y in s.labels])
            meta.update(num_classes=1, note="regression: --regression-target --num-classes 1")
        kinds = [f"input{k}" for k in range(len(splits[0].texts))] + (["label"] if classes else [])
        finish(dest, final, meta, {(kind, s.name): len(s.labels) for s in splits for kind in kinds})
    return meta


def check_name(name: str) -> str:
    from recadam_fairseq.core import glue_tasks

    if not name or any(c in name for c in "/\\ \t") or name.startswith("."):
        raise PrepError(f"--task-name {name!r}: a name for a directory (no spaces or slashes)")
    try:
        glue = glue_tasks.canonical(name)
    except glue_tasks.UnknownTask:
        return name
    raise PrepError(f"--task-name {name}: GLUE's {glue} (data-prep/prepare_glue.py makes GLUE's data); name your "
                    f"task otherwise")


def prepare(args) -> dict:
    name = check_name(args.task_name)
    metric = args.metric or ("pearson" if args.regression else "accuracy")
    if (metric == "pearson") != bool(args.regression):
        raise PrepError(f"--metric {metric}: " + ("a regression's metric is pearson" if args.regression else
                                                   "pearson is a regression's (--regression)"))
    text_columns = [args.text_column] + ([args.text2_column] if args.text2_column else [])
    files = [("train", args.train), ("valid", args.valid)] + ([("test", args.test)] if args.test else [])
    splits = [read_split(n, p, file_format(p, args.format), text_columns, args.label_column) for n, p in files]
    classes = check_labels(splits, args.label_column, args.regression, metric)
    tokens = Tokens(args.model)
    facts = tokenize(splits, tokens, args.max_unk)
    columns = {"text": args.text_column, "text2": args.text2_column, "label": args.label_column}
    return build(splits, classes, args.out, name, args.model, metric, facts, columns)


def report(meta: dict, out_dir: str) -> str:
    lines = [f"wrote {os.path.join(out_dir, meta['task'] + '-bin')}: "
             + (f"{meta['num_classes']} classes ({', '.join(meta['id2label'].values())})" if not meta["regression"]
                else "a regression") + f", metric {meta['metric']}"]
    for split, f in meta["prepared"].items():
        lines.append(f"  {split}: {f['examples']:,} examples, {f['tokens']:,} tokens, "
                     f"{100 * f['unk'] / max(f['tokens'], 1):.2f}% <unk>, {f['cut']:,} cut to the model's positions")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s --model DIR --task-name NAME --train FILE --valid FILE "
                                       "--text-column C [--text2-column C] --label-column C --out DIR")
    ap.add_argument("--model", required=True, help="a directory of data-prep/convert_hf_to_fairseq.py")
    ap.add_argument("--task-name", required=True, help="your task's name: DIR/NAME-bin, the runs' TASK")
    ap.add_argument("--train", required=True, help="the training examples (TSV, CSV or JSONL with a header; Parquet)")
    ap.add_argument("--valid", required=True, help="the dev examples")
    ap.add_argument("--test", help="held-out examples (binarized as the test split)")
    ap.add_argument("--format", choices=sorted(set(FORMATS.values())), help="the files' format (default: their "
                                                                             "extension's)")
    ap.add_argument("--text-column", required=True, help="the column of the text")
    ap.add_argument("--text2-column", help="the second text's column, for sentence pairs")
    ap.add_argument("--label-column", required=True, help="the column of the label")
    ap.add_argument("--regression", action="store_true", help="the label is a number to predict")
    ap.add_argument("--metric", choices=list(METRICS), help="the dev metric (default: accuracy; pearson for a "
                                                            "regression)")
    ap.add_argument("--max-unk", type=float, default=MAX_UNK, help="the largest share of <unk> tokens (default: "
                                                                   "%(default)s)")
    ap.add_argument("--out", required=True, help="the data directory: OUT/NAME-bin")
    args = ap.parse_args(argv)
    try:
        meta = prepare(args)
    except PrepError as e:
        print(f"prepare_task.py: error: {e}", file=sys.stderr)
        return 1
    print(report(meta, args.out))
    return 0
