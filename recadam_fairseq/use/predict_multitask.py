"""Test-set predictions of a ``--task glue_multitask`` checkpoint, in GLUE's submission format.

    python scripts/glue/predict_multitask.py CHECKPOINT --glue-dir glue_data --bpe-dir gpt2_bpe \\
        --out predictions [--data glue-bin] [--tasks CoLA STS-B ...] [--batch-size 32] [--cpu]

For each GLUE task the model was trained on (or each of --tasks; a user's own task is skipped,
saying so) it reads the GLUE test file(s)
(``<glue-dir>/<TASK>/test.tsv``; MNLI: ``test_matched.tsv``, ``test_mismatched.tsv``),
encodes them exactly as ``data-prep/prepare_glue.py`` encodes train/dev (same GPT-2 BPE, same
dictionary, ``<s> A </s>`` or ``<s> A </s> </s> B </s>``), runs the task's head and writes
``<out>/<NAME>.tsv`` with the header ``index<TAB>prediction``: the label name for
classification (fairseq's label dictionary, as labels.json's id2label), the 0..5 score with 3
decimals for STS-B (the model predicts score / 5 unless the data was prepared with --stsb-raw-scores).
The names are those of GLUE's submission zip: CoLA.tsv, SST-2.tsv, MRPC.tsv, QQP.tsv, STS-B.tsv,
MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv.

``--data`` (default: the path the model was trained with) is the prepare_glue output holding
the ``<TASK>-bin`` directories (their dictionary and labels.json). Loading, encoding and the
heads are those of ``scripts/glue/predict.py`` (recadam_fairseq/use/predict.py), which labels
any sentences, of one task or of a multi-task run.
"""

import argparse
import os
import sys

from recadam_fairseq.core import glue_tasks  # test files, their text columns, submission names
from recadam_fairseq.use import predict


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

    try:
        model, task, _ = predict.load(args.checkpoint, args.data, cpu=args.cpu)
    except predict.PredictError as e:
        raise SystemExit(f"predict_multitask: {e}") from None
    if not hasattr(task, "mt_task_names"):
        raise SystemExit(f"predict_multitask: {args.checkpoint} was not trained with --task glue_multitask")
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
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        try:
            clf = predict.Classifier(model, task, name, args.bpe_dir, where=args.checkpoint)
        except predict.PredictError as e:
            raise SystemExit(f"predict_multitask: {e}") from None
        gt = glue_tasks.TASKS[name]
        for fname, outname in gt.submission_names().items():
            rows = read_test(os.path.join(args.glue_dir, name, fname), name, gt.test_text_cols)
            preds = clf.predict([texts for _, texts in rows], args.batch_size)
            path = os.path.join(args.out, outname)
            with open(path, "w", encoding="utf-8") as f:
                f.write("index\tprediction\n")
                for (index, _), p in zip(rows, preds):
                    f.write(f"{index}\t{min(max(p, 0.0), 5.0):.3f}\n" if clf.regression else f"{index}\t{p[0]}\n")
            print(f"{name}: {len(rows)} predictions -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
