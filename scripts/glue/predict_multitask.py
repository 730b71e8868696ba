#!/usr/bin/env python3
"""Test-set predictions of a ``--task glue_multitask`` checkpoint, in GLUE's submission format.

    python scripts/glue/predict_multitask.py CHECKPOINT --glue-dir glue_data --bpe-dir gpt2_bpe \\
        --out predictions [--data glue-bin] [--tasks CoLA STS-B ...] [--batch-size 32] [--cpu]

For each GLUE task the model was trained on (or each of --tasks; a user's own task is skipped,
saying so) it reads the GLUE test file(s)
(``<glue-dir>/<TASK>/test.tsv``; MNLI: ``test_matched.tsv``, ``test_mismatched.tsv``),
encodes them exactly as ``data-prep/prepare_glue.py`` encodes train/dev (same GPT-2 BPE, same
dictionary, ``<s> A </s>`` or ``<s> A </s> </s> B </s>``), runs the task's head and writes
``<out>/<NAME>.tsv`` with the header ``index<TAB>prediction``: the label name for
classification (``labels.json``'s id2label), the 0..5 score with 3 decimals for STS-B (the
model predicts score / 5 unless the data was prepared with --stsb-raw-scores). The names are
those of GLUE's submission zip: CoLA.tsv, SST-2.tsv, MRPC.tsv, QQP.tsv, STS-B.tsv, MNLI-m.tsv,
MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv.

``--data`` (default: the path the model was trained with) is the prepare_glue output holding
the ``<TASK>-bin`` directories (their dictionary and labels.json).
"""

import argparse
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

sys.path.insert(0, REPO)
from recadam_fairseq.core import glue_tasks  # noqa: E402  (test files, their text columns, submission names)


def load_prepare_glue():
    spec = importlib.util.spec_from_file_location("prepare_glue", os.path.join(REPO, "data-prep", "prepare_glue.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("prepare_glue", mod)
    spec.loader.exec_module(mod)
    return mod


def read_test(path, task, ncols_text):
    """[(index, [texts])] of a GLUE test file (header line skipped)."""
    if not os.path.isfile(path):
        raise SystemExit(f"predict_multitask: {path}: missing {task} test file")
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            fields = raw.decode("utf-8").lstrip("\ufeff").rstrip("\r\n").split("\t")
            if lineno == 1:
                continue
            need = max(ncols_text) + 1
            if len(fields) < need:
                raise SystemExit(f"predict_multitask: {path}, line {lineno}: expected at least {need} columns, "
                                 f"got {len(fields)}")
            rows.append((fields[0], [fields[c] for c in ncols_text]))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="checkpoint of a --task glue_multitask run (e.g. checkpoint_best.pt)")
    ap.add_argument("--glue-dir", required=True, help="GLUE data: <DIR>/<TASK>/test.tsv")
    ap.add_argument("--bpe-dir", required=True, help="encoder.json and vocab.bpe used by prepare_glue.py")
    ap.add_argument("--out", required=True, help="directory for the <NAME>.tsv prediction files")
    ap.add_argument("--data", help="prepare_glue.py output (default: the training data path in the checkpoint)")
    ap.add_argument("--tasks", nargs="+", help="subset of the model's tasks (default: all)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    args = ap.parse_args(argv)

    import torch
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    sys.path.insert(0, REPO)
    import recadam_fairseq

    recadam_fairseq.register()
    overrides = {"data": os.path.abspath(args.data)} if args.data else {}
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint], arg_overrides=overrides)
    model = models[0].eval()
    if not hasattr(task, "mt_task_names"):
        raise SystemExit(f"predict_multitask: {args.checkpoint} was not trained with --task glue_multitask")
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    model.to(device)
    names = task.mt_task_names
    if args.tasks:
        canon = {n.lower(): n for n in names}
        unknown = [t for t in args.tasks if t.lower() not in canon]
        if unknown:
            raise SystemExit(f"predict_multitask: --tasks {' '.join(unknown)}: the model knows {', '.join(names)}")
        names = [canon[t.lower()] for t in args.tasks]
    own = [n for n in names if n not in glue_tasks.TASKS]  # a user's own tasks: GLUE has no test file for them
    if own and args.tasks:
        raise SystemExit(f"predict_multitask: --tasks {' '.join(own)}: not GLUE tasks (this script writes GLUE's "
                         f"test submission files)")
    if own:
        print(f"predict_multitask: skipping {', '.join(own)}: not GLUE tasks (no GLUE test file to predict)",
              file=sys.stderr)
        names = [n for n in names if n in glue_tasks.TASKS]
        if not names:
            raise SystemExit(f"predict_multitask: {args.checkpoint} has no GLUE task (its tasks: "
                             f"{', '.join(task.mt_task_names)})")
    pg = load_prepare_glue()
    d = task.source_dictionary
    init, sep = task.cfg.init_token, task.cfg.separator_token
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        t = task.mt_task_names.index(name)
        meta = task.metas[t]
        scale = 1.0
        if meta["regression"]:
            m = re.fullmatch(r"score / ([0-9.]+)", meta.get("target", "score / 1"))
            scale = float(m.group(1)) if m else 1.0
        gt = glue_tasks.TASKS[name]
        for fname, outname in gt.submission_names().items():
            rows = read_test(os.path.join(args.glue_dir, name, fname), name, gt.test_text_cols)
            columns = list(zip(*[texts for _, texts in rows])) if rows else []
            encoded = [pg.bpe_encode(list(col), args.bpe_dir, 1) for col in columns]
            examples = []
            for k in range(len(rows)):
                parts = []
                for j, enc in enumerate(encoded):
                    ids = d.encode_line(enc[k], append_eos=True, add_if_not_exist=False).long()
                    lead = init if j == 0 else sep
                    parts.append(ids if lead is None else torch.cat([ids.new_tensor([lead]), ids]))
                examples.append(torch.cat(parts)[: task.cfg.max_positions])
            preds = []
            with torch.no_grad():
                for s in range(0, len(examples), args.batch_size):
                    chunk = examples[s:s + args.batch_size]
                    sample = {"net_input": {"src_tokens": data_utils.collate_tokens(chunk, d.pad()).to(device),
                                            "src_lengths": torch.tensor([len(x) for x in chunk], device=device)},
                              "task_ids": torch.full((len(chunk),), t, dtype=torch.long, device=device)}
                    feats = task.forward_features(model, sample)
                    logits = model.classification_heads[task.head_name(name)](feats).float().cpu()
                    preds += (logits.view(-1) if meta["regression"] else logits.argmax(-1)).tolist()
            path = os.path.join(args.out, outname)
            with open(path, "w", encoding="utf-8") as f:
                f.write("index\tprediction\n")
                for (index, _), p in zip(rows, preds):
                    if meta["regression"]:
                        f.write(f"{index}\t{min(max(p * scale, 0.0), 5.0):.3f}\n")
                    else:
                        f.write(f"{index}\t{meta['id2label'][str(int(p))]}\n")
            print(f"{name}: {len(rows)} predictions -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
