"""End to end: fairseq-train on the tiny generated RoBERTa, RecAdam against its base, milliseconds per update."""

import os
import statistics
import subprocess
import sys
import tempfile
from typing import List

from recadam_fairseq import catalogue
from recadam_fairseq.engine.fairseq_log import parse_log_lines
from recadam_fairseq.launch import tiny_train
from recadam_fairseq.launch.recipe import REPO


ROOT = REPO  # the checkout
E2E_BASE = catalogue.get("recadam").base  # RecAdam timed against its base in the catalogue (adam)
E2E = (E2E_BASE, "recadam")  # methods of the catalogue, at its defaults but t0 (the runs are short)


def e2e_optimizer(name: str) -> List[str]:
    """A method's optimizer flags, as the catalogue writes them."""
    m = catalogue.get(name)
    return m.flags({**m.defaults(), **({"t0": "100"} if "t0" in m.knobs else {})})["optimizer"]


def e2e_train(tiny_dir: str, name: str, updates: int, log_interval: int, threads: int) -> float:
    """One fairseq-train run of the tiny model: seconds per update (fairseq's ``ups``) after the first interval."""
    save = os.path.join(tiny_dir, f"e2e-{name}")
    cmd = [sys.executable, "-m", "fairseq_cli.train",
           *tiny_train.finetune(os.path.join(tiny_dir, "cls-bin"), save, pretrained=os.path.join(tiny_dir, "pretrained.pt"),
                          optimizer=e2e_optimizer(name), lr="1e-5", updates=updates, log_interval=log_interval)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-train ({name}) failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    records = parse_log_lines((proc.stdout + proc.stderr).splitlines())["train_inner"]
    # updates per second over each log interval (train_wall is logged in whole seconds); the first
    # interval holds start-up work
    ups = [float(r["ups"]) for r in records[1:]]
    if not ups or min(ups) <= 0:
        raise RuntimeError(f"fairseq-train ({name}): no train_inner records to time")
    return statistics.mean(1.0 / u for u in ups)


def run_e2e(updates: int, rounds: int, threads: int) -> List[dict]:
    """fairseq-train on the tiny generated RoBERTa and task, adam and recadam alternating by round."""
    tmp = tempfile.mkdtemp(prefix="recadam-e2e-")
    with open(os.path.join(tmp, "make.log"), "w") as log:  # fairseq-preprocess prints a lot
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny_roberta.py"), tmp],
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    interval = max(1, updates // 10)
    times = {n: [] for n in E2E}
    for r in range(rounds):
        names = list(E2E)
        for name in names[r % 2:] + names[:r % 2]:
            times[name].append(e2e_train(tmp, name, updates, interval, threads))
    base = statistics.median(times[E2E_BASE])
    return [dict(optimizer=n, ms_per_update=1e3 * statistics.median(ts), runs=len(ts), updates=updates,
                 ratio_vs_adam=statistics.median(ts) / base) for n, ts in times.items()]


def e2e_table(rows: List[dict]) -> str:
    lines = ["| optimizer | ms / update (median of runs) | vs adam | runs × updates |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['optimizer']} | {r['ms_per_update']:.2f} | {r['ratio_vs_adam']:.3f}x | "
                     f"{r['runs']} × {r['updates']} |")
    return "\n".join(lines)
