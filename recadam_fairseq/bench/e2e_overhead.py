"""What each method costs inside real fairseq-train: ms per update and peak memory, against its base.

Generates a RoBERTa-sized setup (random "pretrained" weights after one masked-LM update, a
50,265-symbol dictionary, GLUE-length sentences of 64 to 126 tokens, two classes), then runs
``fairseq-train`` (through ``train_peak.py``, which adds the peak CUDA memory) once per method
and round, the order rotating by round. Its rows are the catalogue's GPU rows (recadam_fairseq/catalogue.py:
each method's, against its base's) and their flags come from the forgetting harness
(recadam_fairseq/engine/methods.py, the comparison's specs), so the commands are the ones the comparison ran.

    python scripts/gpu/e2e_overhead.py                          # GPU, --fp16, roberta-base, 2 rounds
    python scripts/gpu/e2e_overhead.py --size tiny --precision fp32 --updates 6   # CPU smoke run
    python scripts/gpu/e2e_overhead.py --doc docs/performance.md   # also the table into that page

``--doc PATH`` writes the table between the ``<!-- gpu-e2e:start -->`` / ``<!-- gpu-e2e:end -->`` lines
of PATH (docs/performance.md).

Time per update: the mean of 1/ups over fairseq's log intervals, the first (start-up) left out;
the median over rounds. Peak memory: ``torch.cuda.max_memory_allocated`` of the whole run.
"""

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from recadam_fairseq import catalogue  # its GPU rows
from recadam_fairseq.engine import methods  # the comparison's specs, on the catalogue
from recadam_fairseq.engine.fairseq_log import parse_log_lines
from recadam_fairseq.bench import bench_rows
from recadam_fairseq.launch import tiny_train
from recadam_fairseq.launch.recipe import PRECISION, REPO
from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta
from recadam_fairseq.tiny.text_data import glue_layout
from recadam_fairseq.tools import readme_block

ROOT = REPO  # the checkout
TRAIN_PEAK = os.path.join(ROOT, "scripts", "gpu", "train_peak.py")  # fairseq-train, then its peak CUDA memory
README_START, README_END = "<!-- gpu-e2e:start -->", "<!-- gpu-e2e:end -->"

ARCH = tiny_train.ARCH  # the model's shapes: base (roberta-base's) or tiny
DICT_SIZE = {"base": 50260, "tiny": 96}  # dict.txt lines; fairseq adds 4 specials, the task <mask>: 50265
LENGTHS = {"base": (64, 126), "tiny": (10, 60)}  # tokens per sentence (+ <s> </s> within max positions)
RECADAM = {"t0": "250"}  # λ(t) at 1/2 in the middle of a longer run than the comparison's


def gpu_rows():
    """name -> (methods spec, extra flags, base name): the catalogue's GPU rows, each timed against its base (the
    row of its base method, unless the row says); its knobs at the comparison's defaults but RECADAM and its own."""
    out = {}
    label = {}  # a method's own row: the row of those it is the base of
    for m in catalogue.METHODS.values():
        for v in bench_rows.variants(m.name, "gpu"):
            label.setdefault(m.name, v.label)
            values = {**(RECADAM if m.uses_recadam else {}), **dict(v.values)}
            spec = m.name + (":" + ",".join(f"{k}={x}" for k, x in values.items()) if values else "")
            out[v.label] = (spec, list(v.extra), v.base or label.get(m.base, v.label), v.default)
    return out


# name -> (methods spec, extra flags, base name, timed by default)
CATALOGUE = gpu_rows()
DEFAULT_METHODS = [n for n, row in CATALOGUE.items() if row[3]]
FISHER_EXAMPLES = "1,024"  # --ewc-fisher-examples' default
FISHER_LINE = re.compile(r"ewc: the Fisher pass took ([\d.]+) s \((\d+) per-example gradients")


def preprocess(args: List[str]) -> None:
    import logging

    logging.getLogger("fairseq_cli.preprocess").setLevel(logging.WARNING)  # it logs its whole namespace
    tiny_roberta.preprocess(args)


def make_setup(work: str, size: str, n_train: int, seed: int, cpu: bool, precision: str) -> Dict:
    """dict.txt, sentiment-bin/{input0,label} (the layout glue_layout links for glue_multitask) and
    pretrained.pt (one masked-LM update from random weights)."""
    rng = random.Random(seed)
    raw = os.path.join(work, "raw")
    os.makedirs(raw, exist_ok=True)
    words = [f"w{i}" for i in range(DICT_SIZE[size])]
    with open(os.path.join(raw, "dict.txt"), "w") as f:
        f.writelines(f"{w} {DICT_SIZE[size] - i}\n" for i, w in enumerate(words))
    lo, hi = LENGTHS[size]
    for split, n in (("train", n_train), ("valid", 64)):
        with open(os.path.join(raw, f"{split}.input0"), "w") as f:
            f.writelines(" ".join(rng.choices(words, k=rng.randint(lo, hi))) + "\n" for _ in range(n))
        with open(os.path.join(raw, f"{split}.label"), "w") as f:
            f.writelines(f"{rng.randint(0, 1)}\n" for _ in range(n))
    data = os.path.join(work, "data")
    cls = os.path.join(data, "sentiment-bin")
    pre = ["--only-source", "--workers", str(min(8, os.cpu_count() or 1))]
    preprocess(pre + ["--trainpref", f"{raw}/train.input0", "--validpref", f"{raw}/valid.input0",
                      "--destdir", f"{cls}/input0", "--srcdict", f"{raw}/dict.txt"])
    preprocess(pre + ["--trainpref", f"{raw}/train.label", "--validpref", f"{raw}/valid.label",
                      "--destdir", f"{cls}/label"])
    save = os.path.join(work, "pretrain")
    cmd = [sys.executable, "-m", "fairseq_cli.train",
           *tiny_train.masked_lm_start(f"{cls}/input0", save, size, hi + 2, seed, cpu, precision)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"e2e_overhead: the masked-LM start failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    pretrained = os.path.join(work, "pretrained.pt")
    os.replace(os.path.join(save, "checkpoint_last.pt"), pretrained)
    glue = glue_layout(data)
    return {"sentiment": cls, "glue": glue, "pretrained": pretrained}


def train_command(args, setup: Dict, name: str, save_dir: str) -> List[str]:
    spec, extra, *_ = CATALOGUE[name]
    s = methods.parse(spec)
    f = methods.flags(s, tiny_train.encoder_layers(args.size))
    arch, task = methods.arch_and_task(f, ARCH[args.size])
    data = setup["glue"] if f["task"] else setup["sentiment"]
    return tiny_train.finetune(
        data, save_dir, *f["extra"], pretrained=setup["pretrained"], task=[*task, *f["criterion"]],
        arch=arch, glue_recipe=True, precision=args.precision, optimizer=[*f["optimizer"], *extra], lr="1e-05",
        updates=args.updates, batch_size=args.batch_size, cpu=args.cpu, workers=1, log_interval=args.log_interval)


def run_one(args, setup: Dict, name: str, rnd) -> Dict:
    run_dir = os.path.join(args.work, "runs", f"{name}-r{rnd}")
    os.makedirs(run_dir, exist_ok=True)
    peak_json = os.path.join(run_dir, "peak.json")
    cmd = train_command(args, setup, name, run_dir)
    t = time.time()
    proc = subprocess.run([sys.executable, TRAIN_PEAK, peak_json, *cmd],
                          capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    with open(os.path.join(run_dir, "train.log"), "w") as f:
        f.write(log)
    if proc.returncode != 0:
        raise SystemExit(f"e2e_overhead: fairseq-train failed for {name}:\n{log[-3000:]}")
    records = parse_log_lines(log.splitlines())["train_inner"]
    ups = [float(r["ups"]) for r in records[1:]]  # the first interval holds start-up work
    if not ups or min(ups) <= 0:
        raise SystemExit(f"e2e_overhead: {name}: fewer than 2 log intervals to time (--updates / --log-interval)")
    m = re.search(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)", log)
    with open(peak_json) as f:
        peak = json.load(f)
    fisher = FISHER_LINE.search(log)
    return {"s_per_update": statistics.mean(1.0 / u for u in ups), "intervals": len(ups),
            "fisher_s": float(fisher.group(1)) if fisher else None,
            "fisher_examples": int(fisher.group(2)) if fisher else None,
            "params": int(m.group(1).replace(",", "")) if m else None,
            "trained": int(m.group(2).replace(",", "")) if m else None,
            "peak_bytes": peak["max_allocated"], "wall_s": round(time.time() - t, 1),
            "command": ["fairseq-train", *cmd]}


def anchor_bytes(name: str, trained: Optional[int]) -> Optional[int]:
    """What RecAdam's θ* should add: one copy of the trained parameters, in the anchor's dtype."""
    if trained is None or not CATALOGUE[name][0].startswith("recadam"):  # its spec's method
        return None
    base = CATALOGUE[CATALOGUE[name][2]][0]
    if base.startswith("recadam"):
        return 0  # against RecAdam itself: no second anchor
    extra = CATALOGUE[name][1]
    half = "--recadam-anchor-dtype" in extra and extra[extra.index("--recadam-anchor-dtype") + 1] in ("bf16", "fp16")
    return trained * (2 if half else 4)  # --recadam-anchor-dtype's default: fp32


def summarize(args, runs: Dict[str, List[Dict]]) -> List[Dict]:
    med = {n: statistics.median(r["s_per_update"] for r in rs) for n, rs in runs.items()}
    peak = {n: max((r["peak_bytes"] or 0) for r in rs) or None for n, rs in runs.items()}
    rows = []
    for n, rs in runs.items():
        base = CATALOGUE[n][2]
        row = {"method": n, "spec": CATALOGUE[n][0], "extra": CATALOGUE[n][1], "base": base,
               "ms_per_update": 1e3 * med[n], "per_round_ms": [1e3 * r["s_per_update"] for r in rs],
               "ratio_vs_base": med[n] / med[base] if base in med else None,
               "peak_mib": peak[n] / 2**20 if peak[n] else None,
               "extra_mib": (peak[n] - peak[base]) / 2**20 if peak[n] and base in peak and peak[base] else None,
               "trained_params": rs[0]["trained"], "rounds": len(rs), "updates": args.updates,
               "fisher_s": statistics.median(r["fisher_s"] for r in rs) if rs[0].get("fisher_s") is not None else None,
               "command": rs[0]["command"]}
        if row["fisher_s"] is not None:  # the pass per example against adam's training time per example
            row["fisher_ms_per_example"] = 1e3 * row["fisher_s"] / rs[0]["fisher_examples"]
            row["fisher_vs_adam_per_example"] = (row["fisher_ms_per_example"] / (1e3 * med["adam"] / args.batch_size)
                                                 if "adam" in med else None)
        a = anchor_bytes(n, rs[0]["trained"])
        row["anchor_mib"] = a / 2**20 if a is not None else None
        rows.append(row)
    return rows


def fisher_cell(r: Dict) -> str:
    """EWC's Fisher pass: its seconds, per example, and against adam's training time per example (its ms / update
    over the batch size)."""
    if r.get("fisher_s") is None:
        return "–"
    vs = r.get("fisher_vs_adam_per_example")
    return (f"{r['fisher_s']:.1f} s Fisher ({r['fisher_ms_per_example']:.2f} ms an example"
            + (f", {vs:.1f}x adam's training per example)" if vs is not None else ")"))


def table(rows: List[Dict]) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| method | base | ms / update | vs base | peak MiB | over base MiB | anchor MiB | before update 1 | "
             "rounds × updates |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['base']} | {r['ms_per_update']:.1f} | "
                     f"{f(r['ratio_vs_base'], '.3f')}x | {f(r['peak_mib'], '.0f')} | {f(r['extra_mib'], '.0f')} | "
                     f"{f(r['anchor_mib'], '.0f')} | "
                     f"{fisher_cell(r)} | "
                     f"{r['rounds']} × {r['updates']} |")
    return "\n".join(lines)


def machine_info() -> Dict:
    import torch

    import fairseq

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "fairseq": fairseq.__version__,
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            info["driver"] = None
    return info


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(CATALOGUE),
                    help="methods to time; each method's base is added when missing")
    ap.add_argument("--size", choices=list(ARCH), default="base", help="model shapes (tiny: a CPU smoke run)")
    ap.add_argument("--precision", choices=list(PRECISION), default="fp16")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--updates", type=int, default=120, help="updates per fairseq-train run")
    ap.add_argument("--log-interval", type=int, default=20, help="fairseq's log interval (one timing sample each)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--train-size", type=int, default=2048, help="generated training sentences")
    ap.add_argument("--rounds", type=int, default=2, help="fairseq-train runs per method, the order rotating")
    ap.add_argument("--warmup-runs", type=int, default=1,
                    help="untimed fairseq-train runs of the first method before the rounds (on the H200 the first "
                         "run of a fresh machine was 20-50%% slower than the others)")
    ap.add_argument("--work", help="work directory (default: a new temporary one)")
    ap.add_argument("--out-md", default="e2e.md")
    ap.add_argument("--out-json", default="e2e.json")
    ap.add_argument("--list", action="store_true", help="print each method's fairseq-train command as JSON; run nothing")
    readme_block.add_doc_option(ap, f"also write the table between the {README_START} / {README_END} lines of "
                                    "PATH (docs/performance.md)")
    args = ap.parse_args(argv)
    args.doc = readme_block.doc_target(ap, args, README_START, README_END)
    for flag in ("updates", "log_interval", "batch_size", "train_size", "rounds"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.updates < 2 * args.log_interval:
        ap.error(f"--updates {args.updates}: needs at least 2 log intervals of --log-interval {args.log_interval} "
                 "(the first is start-up and is not timed)")
    names = []

    def add(n):  # a method after its base, and its base's base
        if n not in names:
            if CATALOGUE[n][2] != n:
                add(CATALOGUE[n][2])
            names.append(n)

    for n in args.methods:
        add(n)
    args.methods = names
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        args.cpu = False
        print(json.dumps({n: [CATALOGUE[n][0], train_command(args, {"glue": "GLUE", "sentiment": "DATA", "pretrained":
                                                                    "PT"}, n, "SAVE")] for n in args.methods}))
        return 0
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("e2e_overhead: --device cuda: CUDA is not available")
    if args.device == "cpu" and args.precision != "fp32":
        sys.exit(f"e2e_overhead: --precision {args.precision} needs a GPU (fairseq's half precision does not "
                 "run with --cpu); use --precision fp32")
    args.cpu = args.device == "cpu"
    args.work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="recadam-e2e-gpu-"))
    info = machine_info()
    print(f"machine: {json.dumps(info)}; work in {args.work}", flush=True)
    t0 = time.time()
    setup = make_setup(args.work, args.size, args.train_size, 1, args.cpu, args.precision)
    print(f"setup: {time.time() - t0:.0f} s", flush=True)
    runs = {n: [] for n in args.methods}
    where = (f"{info.get('gpu', info['cpu'])}" + (f", driver {info['driver']}" if info.get("driver") else "")
             + f", torch {info['torch']}" + (f" (CUDA {info['cuda']})" if info.get("cuda") else "")
             + f", fairseq {info['fairseq']}")
    command = f"python scripts/gpu/e2e_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}"

    def write(done: int, total: int) -> str:
        """The table so far (rewritten after every run: a run cut off by a time limit keeps what finished)."""
        rows = summarize(args, {n: rs for n, rs in runs.items() if rs})
        md = (f"{table(rows)}\n\nfairseq-train, {args.size} shapes ({'?' if rows[0]['trained_params'] is None else format(rows[0]['trained_params'], ',')} trained parameters), "
              f"{' '.join(PRECISION[args.precision]) or 'fp32'}, batch {args.batch_size} of "
              f"{LENGTHS[args.size][0]}–{LENGTHS[args.size][1]} tokens, {args.updates} updates per run, median over "
              f"{args.rounds} rounds; {where}. ms / update: mean of 1/ups over fairseq's log intervals after the "
              f"first. Peak: torch.cuda.max_memory_allocated of the run. Anchor: the trained parameters once in the "
              f"anchor's dtype (what RecAdam should add over adam). Before update 1: EWC's Fisher pass "
              f"(--ewc-fisher task: {FISHER_EXAMPLES} per-example gradients, --ewc-fisher-batch-size at a time), not in ms / "
              f"update; adam's training per example: its ms / update over the batch size. Command: `{command}`.")
        if done < total:
            md = f"**Partial: {done} of {total} runs finished.**\n\n" + md
        with open(args.out_md, "w", encoding="utf-8") as f:
            f.write(md + "\n")
        with open(args.out_json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "size": args.size, "precision": args.precision, "batch_size": args.batch_size,
                       "updates": args.updates, "rounds": args.rounds, "complete": done == total, "rows": rows,
                       "seconds": round(time.time() - t0, 1), "command": command}, f, indent=2)
            f.write("\n")
        return md

    for w in range(args.warmup_runs):
        r = run_one(args, setup, args.methods[0], f"warmup{w}")
        print(f"warm-up {args.methods[0]}: {1e3 * r['s_per_update']:.1f} ms/update (not counted)", flush=True)
    total, done = args.rounds * len(args.methods), 0
    for rnd in range(args.rounds):
        k = rnd % len(args.methods)
        for n in args.methods[k:] + args.methods[:k]:
            r = run_one(args, setup, n, rnd)
            runs[n].append(r)
            done += 1
            peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f} MiB"
            print(f"round {rnd + 1} {n}: {1e3 * r['s_per_update']:.1f} ms/update, peak {peak} ({r['wall_s']} s)",
                  flush=True)
            md = write(done, total)
    if args.doc:
        readme_block.replace_block(args.doc, README_START, README_END, md)
    print("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
