"""EWC's Fisher in the comparison: one file per target data, written once and shared by every EWC run.

``--ewc-fisher task`` computes F before update 1 from the first N examples of that run's epoch-1 order,
which costs ~7 minutes per MiniLM run on one CPU thread (one backward per example), more than its 200
updates. The comparison computes it once instead, with ``scripts/fisher.py`` over the shared command of
``adam`` at seed 1 (the same data, model, criterion and θ*; the file is the same empirical Fisher that
``task`` computes), and its EWC runs take ``--ewc-fisher FILE``: every seed and γ of ewc and recadam-ewc
sees one F, as a user's sweep with the file would (docs/ewc.md). The file, named for its number of examples
(``--fisher-examples``), is computed again when its command or the data changes (``fisher.json`` records
both)."""

import dataclasses
import os
import subprocess
import sys
import time

from recadam_fairseq.compare import methods
from recadam_fairseq.compare.files import ROOT, SCRIPTS, read_json, rel, write_json
from recadam_fairseq.compare.runner import RunError, train_command


def wanted(ctx, grid) -> bool:
    """A setting of the grid reads the task's Fisher."""
    return any(_task_flag(methods.flags(s, ctx.num_layers, ctx.mt_task, ctx.multitask)) for s in grid)


def _task_flag(f) -> bool:
    flat = f["optimizer"] + f["criterion"]
    return "--ewc-fisher" in flat and flat[flat.index("--ewc-fisher") + 1] == "task"


def command(ctx, out):
    """scripts/fisher.py over adam's fairseq-train command at seed 1 (its optimizer flags are parsed, unused)."""
    train = train_command(ctx, methods.parse("adam"), 1, os.path.dirname(out))
    return [sys.executable, rel(os.path.join(os.path.dirname(SCRIPTS), "fisher.py")), "--out", rel(out),
            "--examples", str(ctx.opts.fisher_examples), "--", *train]


def path(ctx) -> str:
    """The task's Fisher file (its runs directory, named for --fisher-examples)."""
    return os.path.join(ctx.runs_dir, "ewc-fisher", f"fisher-{ctx.opts.fisher_examples}.pt")


def ensure(ctx, grid, say):
    """``ctx`` with ``fisher`` set to the file when the grid has EWC settings (computed now unless recorded with
    the same command and data; under --report-only only named), else ``ctx`` itself."""
    if not wanted(ctx, grid):
        return ctx
    out = path(ctx)
    out_dir = os.path.dirname(out)
    cmd = command(ctx, out)
    record = {"command": [os.path.basename(cmd[1])] + cmd[2:], "data": ctx.data_key}
    record_path = out[:-len(".pt")] + ".json"
    old = read_json(record_path)
    if not (os.path.isfile(out) and old and {k: old.get(k) for k in record} == record) and not ctx.opts.report_only:
        os.makedirs(out_dir, exist_ok=True)
        say(f"== EWC's Fisher of the target data at θ* ({ctx.opts.fisher_examples or 'all'} examples) -> {rel(out)}")
        t = time.time()
        env = dict(os.environ, OMP_NUM_THREADS=str(ctx.opts.threads), MKL_NUM_THREADS=str(ctx.opts.threads))
        with open(out[:-len(".pt")] + ".log", "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if proc.returncode != 0:
            raise RunError(f"scripts/fisher.py failed ({proc.returncode}); {out[:-len('.pt')]}.log")
        write_json(record_path, dict(record, seconds=round(time.time() - t, 1)))
    return dataclasses.replace(ctx, fisher=out)
