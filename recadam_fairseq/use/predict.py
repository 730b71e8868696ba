"""Label sentences with a fine-tuned run, offline: a run directory (or a checkpoint) in, labels out.

    python scripts/glue/predict.py RUN_DIR [INPUT.tsv|-] [--data DIR] [--bpe-dir gpt2_bpe]
        [--task-name NAME] [--checkpoint-file checkpoint_best.pt] [--header] [--batch-size 32] [--cpu]

RUN_DIR is a run of ``finetune.sh`` / ``multitask.sh`` (its ``checkpoint_best.pt``, else
``checkpoint_last.pt``) or a checkpoint file (``interpolate.py``'s, ``merge_lora.py``'s, a LoRA
run's). The input (a file, or standard input) has one example a line: the sentence, or the two
sentences of a pair separated by a tab. Each line gets one output line: ``LABEL<TAB>PROBABILITY``
(the label as fairseq's label dictionary names it; the softmax of the head's logits) or, for a
regression (STS-B), the score on the data's own scale (labels.json's ``score / 5`` undone).

The text is encoded as the training data was: with ``--bpe-dir`` (encoder.json, vocab.bpe) by the
GPT-2 BPE of ``prepare_glue.py`` (its own functions), else split on whitespace into the words of the
dictionary (the tiny model's data); then ``<s> A </s>`` or ``<s> A </s> </s> B </s>``, cut to the
model's max positions. ``--data`` (default: the path the run was trained with, also tried from the
directory of the run's ``command.sh``) is the ``<TASK>-bin`` directory, or for a multi-task run the
directory holding them. Bad input stops with one line (exit 2).
"""

import argparse
import json
import logging
import os
import re
import sys
from typing import List, Optional, Sequence

CHECKPOINTS = ("checkpoint_best.pt", "checkpoint_last.pt")
PROG = "predict.py"


class PredictError(Exception):
    """Bad input; main() prints it as one line and exits 2."""


# ----------------------------------------------------------------------------- the checkpoint and its data


def find_checkpoint(path: str, checkpoint_file: Optional[str] = None) -> str:
    """The checkpoint of a run directory (``checkpoint_file``, else best, else last), or ``path`` itself."""
    if os.path.isfile(path):
        if checkpoint_file:
            raise PredictError(f"--checkpoint-file {checkpoint_file}: {path} is already a checkpoint file")
        return path
    if not os.path.isdir(path):
        raise PredictError(f"{path}: no such run directory or checkpoint file")
    names = (checkpoint_file,) if checkpoint_file else CHECKPOINTS
    for name in names:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise PredictError(f"{path}: no {' or '.join(names)} (an unfinished run, or not a run directory?)")


def peek_config(ckpt: str) -> dict:
    """The checkpoint's task config as a dict, read without loading its tensors (mmap)."""
    import recadam_fairseq.safe_globals  # noqa: F401  (torch >= 2.6: fairseq's checkpoint types)
    from recadam_fairseq.core import checkpoint_file

    try:  # refused, cut short, not fairseq's: one line (fairseq's own load of it comes after this check)
        state = checkpoint_file.fairseq_state(ckpt)
    except checkpoint_file.CheckpointFileError as e:
        raise PredictError(str(e)) from None
    if state.get("cfg") is not None:
        return dict(state["cfg"]["task"])
    if state.get("args") is not None:  # fairseq < 0.10: one argparse namespace
        return {"_name": state["args"].task, "data": state["args"].data}
    raise PredictError(f"{ckpt}: a checkpoint without its config (neither 'cfg' nor 'args')")


def command_dir(ckpt: str) -> Optional[str]:
    """The directory the run was launched from: the ``cd`` line of its command.sh (the GLUE scripts write it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(ckpt)), "command.sh")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        first = f.readline().strip()
    m = re.fullmatch(r"cd (?:'(.*)'|(\S+))", first)
    return (m.group(1) or m.group(2)) if m else None


def resolve_data(ckpt: str, task_cfg: dict, data: Optional[str]) -> str:
    """The data directory: ``--data``, else the one the run was trained with (relative paths tried from
    here and from the run's launch directory). It must hold what the task loads."""
    multitask = task_cfg.get("_name") == "glue_multitask"
    if data is None:
        trained = str(task_cfg.get("data") or "")
        tries = [trained] + ([os.path.join(command_dir(ckpt), trained)] if command_dir(ckpt) and
                             not os.path.isabs(trained) else [])
        found = [p for p in tries if p and os.path.isdir(p)]
        if not found:
            raise PredictError(f"{ckpt}: its training data {trained or '(none)'} is not here: give --data "
                               f"(the {'directory of the <TASK>-bin directories' if multitask else '<TASK>-bin directory'})")
        data = found[0]
    elif not os.path.isdir(data):
        raise PredictError(f"--data {data}: no such directory")
    if not multitask and not os.path.isfile(os.path.join(data, "input0", "dict.txt")):
        raise PredictError(f"--data {data}: no input0/dict.txt (expected a <TASK>-bin directory of prepare_glue.py)")
    return os.path.abspath(data)


def load(path: str, data: Optional[str] = None, checkpoint_file: Optional[str] = None, cpu: bool = False):
    """(model in eval mode, fairseq task, checkpoint path) through fairseq's own loader, the plug-in registered."""
    import torch
    from fairseq import checkpoint_utils

    import recadam_fairseq

    recadam_fairseq.register()  # our tasks, models (roberta_ft: LoRA, CA-MTL) and criteria
    ckpt = find_checkpoint(path, checkpoint_file)
    data = resolve_data(ckpt, peek_config(ckpt), data)
    try:
        models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data})
    except (OSError, ValueError) as e:  # glue_multitask's MultiTaskError is a ValueError
        raise PredictError(f"{ckpt} with data {data}: {e}") from None
    model = models[0].eval()
    model.to("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    return model, task, ckpt


# ----------------------------------------------------------------------------- text -> token ids


def is_bpe_dictionary(dictionary) -> bool:
    """RoBERTa's GPT-2 dict.txt lists BPE ids (numbers); a word dictionary lists words."""
    symbols = dictionary.symbols[dictionary.nspecial:]
    return bool(symbols) and sum(s.isdigit() for s in symbols) >= 0.9 * len(symbols)


class Encoder:
    """Sentences -> the token ids the model was trained on (prepare_glue.py's BPE, or the words)."""

    def __init__(self, dictionary, bpe_dir: Optional[str], init_token, separator_token, max_positions, where):
        if bpe_dir is not None:
            for name in ("encoder.json", "vocab.bpe"):
                if not os.path.isfile(os.path.join(bpe_dir, name)):
                    raise PredictError(f"--bpe-dir {bpe_dir}: no {name}")
            if not is_bpe_dictionary(dictionary):
                raise PredictError(f"--bpe-dir {bpe_dir}: the dictionary of {where} holds words, not GPT-2 BPE ids: "
                                   f"leave --bpe-dir out")
        elif is_bpe_dictionary(dictionary):
            raise PredictError(f"{where}: its dictionary holds GPT-2 BPE ids: give --bpe-dir (the directory with "
                               f"encoder.json and vocab.bpe that prepare_glue.py used)")
        self.dictionary, self.bpe_dir = dictionary, bpe_dir
        self.init, self.sep, self.max_positions = init_token, separator_token, max_positions

    def encode(self, rows: Sequence[Sequence[str]]):
        """[1-D LongTensor] for rows of one or two texts."""
        import torch

        from recadam_fairseq.prepare import prepare_glue

        columns = [list(col) for col in zip(*rows)]
        if self.bpe_dir is not None:
            columns = [prepare_glue.bpe_encode(col, self.bpe_dir, 1) for col in columns]
        out = []
        for k in range(len(rows)):
            parts = []
            for j, col in enumerate(columns):
                ids = self.dictionary.encode_line(col[k].strip(), append_eos=True, add_if_not_exist=False).long()
                lead = self.init if j == 0 else self.sep
                parts.append(ids if lead is None else torch.cat([ids.new_tensor([lead]), ids]))
            out.append(torch.cat(parts)[: self.max_positions])
        return out


# ----------------------------------------------------------------------------- the classifier


def score_scale(meta: dict) -> float:
    """labels.json's ``"target": "score / 5"`` (prepare_glue.py's STS-B): the factor back to the raw scale."""
    m = re.fullmatch(r"score / ([0-9.]+)", str(meta.get("target", "")))
    return float(m.group(1)) if m else 1.0


def read_labels_json(data: str) -> dict:
    path = os.path.join(data, "labels.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Classifier:
    """A fine-tuned sentence (pair) classifier or regressor: one task's head of a run."""

    def __init__(self, model, task, task_name: Optional[str] = None, bpe_dir: Optional[str] = None, where="the run"):
        self.model, self.task, self.where = model, task, where
        if hasattr(task, "mt_task_names"):  # --task glue_multitask: one head per task
            names = task.mt_task_names
            if task_name is None and len(names) > 1:
                raise PredictError(f"--task-name: {where} was trained on {', '.join(names)}: choose one")
            canon = {n.lower(): n for n in names}
            if task_name is not None and task_name.lower() not in canon:
                raise PredictError(f"--task-name {task_name}: not a task of {where} (its tasks: {', '.join(names)})")
            self.task_name = canon[task_name.lower()] if task_name else names[0]
            self.task_id = names.index(self.task_name)
            sub = task.subtasks[self.task_id]
            self.head, meta = task.head_name(self.task_name), task.metas[self.task_id]
            self.regression, self.label_dictionary = task.regression[self.task_id], task.label_dictionary_of(self.task_id)
        else:
            sub, meta = task, read_labels_json(task.cfg.data)
            own = meta.get("task")
            if task_name is not None and own is not None and task_name.lower() != str(own).lower():
                raise PredictError(f"--task-name {task_name}: {where} is a single-task run of {own}")
            self.task_name, self.task_id = own, None
            self.head = task.cfg.classification_head_name
            self.regression = bool(task.cfg.regression_target)
            self.label_dictionary = None if self.regression else task.label_dictionary
        if self.head not in model.classification_heads:
            raise PredictError(f"{where}: no classification head {self.head!r} (heads: "
                               f"{', '.join(model.classification_heads) or 'none'})")
        self.columns = 2 if os.path.isdir(os.path.join(sub.cfg.data, "input1")) else 1
        self.scale = score_scale(meta) if self.regression else 1.0
        self.bpe_dir, self.input0 = bpe_dir, os.path.join(sub.cfg.data, "input0")
        self._encoder = None

    @property
    def encoder(self) -> Encoder:
        """Built on first use: an export needs no BPE files."""
        if self._encoder is None:
            cfg = self.task.cfg
            self._encoder = Encoder(self.task.source_dictionary, self.bpe_dir, cfg.init_token, cfg.separator_token,
                                    cfg.max_positions, self.input0)
        return self._encoder

    @classmethod
    def load(cls, run: str, data: Optional[str] = None, bpe_dir: Optional[str] = None, task_name: Optional[str] = None,
             checkpoint_file: Optional[str] = None, cpu: bool = False) -> "Classifier":
        model, task, ckpt = load(run, data, checkpoint_file, cpu)
        clf = cls(model, task, task_name, bpe_dir, where=ckpt)
        clf.encoder  # noqa: B018  (a wrong --bpe-dir stops here, before any input is read)
        return clf

    @property
    def labels(self) -> List[str]:
        """The head's outputs in order, as the label dictionary names them (fairseq's targets: id - nspecial)."""
        d, n = self.label_dictionary, self.model.classification_heads[self.head].out_proj.out_features
        return [] if d is None else [d[i + d.nspecial] for i in range(n)]  # (fairseq pads d with madeupwords)

    def logits(self, rows: Sequence[Sequence[str]], batch_size: int = 32):
        """[N, C] float32 logits of the head (C = 1 for a regression), on CPU."""
        import torch
        from fairseq.data import data_utils

        rows = [(row,) if isinstance(row, str) else tuple(row) for row in rows]  # a bare sentence: a 1-tuple
        for i, row in enumerate(rows):
            if len(row) != self.columns:
                raise PredictError(f"example {i + 1}: {len(row)} texts, the task takes {self.columns}")
        device = next(self.model.parameters()).device
        pad, out = self.task.source_dictionary.pad(), []
        examples = self.encoder.encode(rows)
        with torch.no_grad():
            for s in range(0, len(examples), batch_size):
                chunk = examples[s:s + batch_size]
                sample = {"net_input": {"src_tokens": data_utils.collate_tokens(chunk, pad).to(device),
                                        "src_lengths": torch.tensor([len(x) for x in chunk], device=device)}}
                if self.task_id is not None:  # CA-MTL's layers are conditioned on the task id
                    sample["task_ids"] = torch.full((len(chunk),), self.task_id, dtype=torch.long, device=device)
                    feats = self.task.forward_features(self.model, sample)
                else:
                    feats, _ = self.model(**sample["net_input"], features_only=True)
                out.append(self.model.classification_heads[self.head](feats).float().cpu())
        return torch.cat(out) if out else torch.zeros(0, 1 if self.regression else len(self.labels))

    def predict(self, rows: Sequence[Sequence[str]], batch_size: int = 32) -> list:
        """[(label, probability)] for a classification, [score] for a regression (on the data's scale)."""
        logits = self.logits(rows, batch_size)
        if self.regression:
            return [float(x) * self.scale for x in logits.view(-1)]
        labels = self.labels
        probs = logits.softmax(-1)
        best = probs.argmax(-1)
        return [(labels[int(k)], float(p[k])) for k, p in zip(best, probs)]


# ----------------------------------------------------------------------------- the command line


def read_rows(path: str, columns: int, header: bool) -> List[List[str]]:
    """The TSV's rows (or standard input's, for ``-``), each of exactly ``columns`` texts."""
    what = "a sentence pair: 2 tab-separated columns" if columns == 2 else "one sentence: 1 column, no tab"
    if path == "-":
        raw, where = sys.stdin.buffer.read(), "<stdin>"
    else:
        if not os.path.isfile(path):
            raise PredictError(f"{path}: no such input file")
        with open(path, "rb") as f:
            raw, where = f.read(), path
    rows, last = [], raw.count(b"\n") + 1
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if lineno == 1 and header:
            continue
        try:
            text = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise PredictError(f"{where}, line {lineno}: not UTF-8 ({e.reason})") from None
        if lineno == 1:
            text = text.lstrip("\ufeff")
        if not text and lineno == last:
            continue  # the final newline
        fields = text.split("\t")
        if len(fields) != columns:
            raise PredictError(f"{where}, line {lineno}: {len(fields)} column(s); the task takes {what}")
        rows.append(fields)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run directory (runs/TASK/NAME/seedN) or a checkpoint file")
    ap.add_argument("input", nargs="?", default="-", help="TSV of sentences or sentence pairs (default -: stdin)")
    ap.add_argument("--data", help="the <TASK>-bin directory (multi-task: their parent); default: the run's")
    ap.add_argument("--bpe-dir", help="encoder.json and vocab.bpe, as given to prepare_glue.py (a real RoBERTa)")
    ap.add_argument("--task-name", help="the task of a multi-task run (its head)")
    ap.add_argument("--checkpoint-file", help=f"in the run directory (default: {' else '.join(CHECKPOINTS)})")
    ap.add_argument("--header", action="store_true", help="skip the input's first line")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    args = ap.parse_args(argv)
    logging.getLogger("fairseq").setLevel(logging.WARNING)  # its loading chatter
    try:
        clf = Classifier.load(args.run, args.data, args.bpe_dir, args.task_name, args.checkpoint_file, args.cpu)
        rows = read_rows(args.input, clf.columns, args.header)
        out = clf.predict(rows, args.batch_size)
    except PredictError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    for p in out:
        print(f"{p:.6f}" if clf.regression else f"{p[0]}\t{p[1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
