"""The tiny model's demonstrations (``make demo``: scripts/demo.sh; docs/ewc.md: scripts/ewc_demo.sh): catalogue
methods fine-tuned on make_tiny_roberta.py's classification set with launch/tiny_train.py's command (300 updates,
lr 1e-4, RecAdam's k 0.1, t0 50, γ 5000), the forgetting meter on held-out text.

    launch.py demo SCRIPT OUT [--ewc] [--jobs N] METHOD...

OUT holds the tiny model (OUT/tiny) and the probe (OUT/probe); each run goes to OUT/METHOD, or OUT/ewc/METHOD with
``--ewc``, which first writes F of the pretraining objective (scripts/fisher.py on the masked-LM text) for the EWC
runs. A run's whole output is its train.log; a failed run shows the log's end and stops the demo (exit 1)."""

import argparse
import os
import re
import shutil
import subprocess
import sys
from typing import List, Optional

from recadam_fairseq import catalogue
from recadam_fairseq.engine.execute import RunError, execute

from . import tiny_train

RECADAM = {"anneal_fun": "sigmoid", "k": "0.1", "t0": "50", "gamma": "5000"}


def argv(out: str, method: str, run_dir: str, fisher: Optional[str] = None, save: bool = True) -> List[str]:
    """fairseq-train's command for ``method`` (RecAdam's knobs at the demo's values, EWC's F ``fisher``)."""
    m = catalogue.get(method)
    values = {k: v for k, v in {**RECADAM, "fisher": fisher}.items() if k in m.knobs and v}
    model = os.path.join(out, "tiny")
    return ["fairseq-train", *tiny_train.finetune(
        os.path.join(model, "cls-bin"), run_dir, pretrained=os.path.join(model, "pretrained.pt"),
        task=tiny_train.classifier("sentence_prediction_recadam"), weight_decay="0.01", optimizer=m.all_flags(values),
        updates=300, save=save, validate=True, log_interval=10, best="accuracy", probe=os.path.join(out, "probe"),
        tensorboard=os.path.join(run_dir, "tb") if save else None)]


def run(cmd: List[str], log: str) -> None:
    """``cmd`` with its whole output in ``log``; on failure the log's end, and a RunError."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        except OSError as e:
            raise RunError(f"cannot run {cmd[0]} ({e.strerror})") from None
    if rc != 0:
        with open(log, errors="replace") as f:
            print("".join(f.readlines()[-30:]), end="", file=sys.stderr)
        raise RunError(f"{cmd[0]} failed (exit {rc}): see {log}")


def report(run_dir: str) -> str:
    """The run's θ* line, its last distance from θ*, its end (fairseq's log lines, without their time and logger)
    and its best dev score."""
    from recadam_fairseq.engine.write import run_line

    with open(os.path.join(run_dir, "train.log"), errors="replace") as f:
        shown = ["|".join(ln.rstrip("\n").split("|")[3:]) or ln.rstrip("\n") for ln in f
                 if re.search(r"recadam: pretrained|recadam_dist: |done training", ln)]
    return "\n".join(shown + [f"   {run_line(run_dir)}"])


def main(argv_: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="launch.py demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("script")
    ap.add_argument("out")
    ap.add_argument("methods", nargs="+", choices=list(catalogue.METHODS))
    ap.add_argument("--ewc", action="store_true", help="the EWC demo: F of the masked-LM objective, runs in OUT/ewc")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    a = ap.parse_args(argv_)
    root = os.path.join(a.out, "ewc") if a.ewc else a.out
    fisher = os.path.join(root, "mlm-fisher.pt") if a.ewc else None

    def one(method):
        def go(say):
            run_dir = os.path.join(root, method)
            if not a.ewc:
                say(f"== fine-tuning: {method} (log: {run_dir}/train.log)")
            shutil.rmtree(run_dir, ignore_errors=True)  # a demo starts over
            run(argv(a.out, method, run_dir, fisher, save=not a.ewc), os.path.join(run_dir, "train.log"))
            if not a.ewc:
                say(report(run_dir))
        return go

    try:
        if fisher:  # once, for both EWC runs
            run(tiny_train.masked_lm_fisher(os.path.join(a.out, "tiny"), fisher), os.path.join(root, "fisher.log"))
        execute([one(m) for m in a.methods], jobs=a.jobs)
    except RunError as e:
        print(f"{os.path.basename(a.script)}: error: {e}", file=sys.stderr)
        return 1
    return 0
