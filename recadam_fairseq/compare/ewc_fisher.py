"""EWC's Fisher in the comparison: one file per target data, written once and shared by every EWC run.

``--ewc-fisher task`` computes F before update 1 from the first N examples of that run's epoch-1 order,
which costs ~1.6 minutes per MiniLM run on one CPU thread (16 per-example gradients a vmap; 8 minutes one
at a time), the same F for every run of the task. The comparison computes it once instead, with ``scripts/fisher.py`` over the shared command of
``adam`` at seed 1 (the same data, model, criterion and θ*; the file is the same empirical Fisher that
``task`` computes), and its EWC runs take ``--ewc-fisher FILE``: every seed and γ of ewc and recadam-ewc
sees one F, as a user's sweep with the file would (docs/ewc.md). The file, named for its number of examples
(``--fisher-examples``), is computed again when its command or the data changes (its ``.json`` beside it records
both)."""

import dataclasses
import os
import subprocess
import time

from recadam_fairseq.engine import methods
from recadam_fairseq.compare.files import ROOT, read_json, rel, write_json
from recadam_fairseq.compare.runner import RunError, train_command
from recadam_fairseq.launch import recipe


def wanted(ctx, grid) -> bool:
    """A setting of the grid reads the task's Fisher."""
    return any(methods.task_fisher_at(f["optimizer"] + f["criterion"]) is not None
               for f in (methods.flags(s, ctx.num_layers, ctx.mt_task, ctx.multitask) for s in grid))


def command(ctx, out):
    """scripts/fisher.py over adam's fairseq-train command at seed 1 (its optimizer flags are parsed, unused)."""
    train = train_command(ctx, methods.parse("adam"), 1, os.path.dirname(out))
    return recipe.fisher_command(rel(out), ctx.opts.fisher_examples, train, script=rel(recipe.FISHER))


def beside(fisher: str, ext: str) -> str:
    """The file next to the Fisher file: its record (``.json``: command, data, seconds) or its log (``.log``)."""
    return os.path.splitext(fisher)[0] + ext


def named(ctx, grid):
    """``ctx`` with ``fisher`` set to the task's file (its runs directory, named for --fisher-examples) when the
    grid has EWC settings, else ``ctx`` itself; nothing is computed."""
    if not wanted(ctx, grid):
        return ctx
    return dataclasses.replace(ctx, fisher=os.path.join(ctx.runs_dir, "ewc-fisher",
                                                        f"fisher-{ctx.opts.fisher_examples}.pt"))


def ensure(ctx, grid, say):
    """:func:`named`'s ``ctx``, its file computed now unless recorded with the same command and data (under
    --report-only never)."""
    ctx = named(ctx, grid)
    out = ctx.fisher
    if out is None or ctx.opts.report_only:
        return ctx
    cmd = command(ctx, out)
    record = {"command": [os.path.basename(cmd[1])] + cmd[2:], "data": ctx.data_key}
    old = read_json(beside(out, ".json"))
    if not (os.path.isfile(out) and old and {k: old.get(k) for k in record} == record):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        say(f"== EWC's Fisher of the target data at θ* ({ctx.opts.fisher_examples or 'all'} examples) -> {rel(out)}")
        t = time.time()
        env = dict(os.environ, OMP_NUM_THREADS=str(ctx.opts.threads), MKL_NUM_THREADS=str(ctx.opts.threads))
        with open(beside(out, ".log"), "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if proc.returncode != 0:
            raise RunError(f"scripts/fisher.py failed ({proc.returncode}); {beside(out, '.log')}")
        write_json(beside(out, ".json"), dict(record, seconds=round(time.time() - t, 1)))
    return ctx
