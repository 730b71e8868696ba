"""Time one optimizer step of RecAdam against Adam implementations, per layout and model size.

For each layout (``flat``: one 1-D fp32 tensor, as fairseq --fp16 hands the optimizer;
``per-tensor``: RoBERTa's parameter shapes) and size, every implementation is timed in rounds:
each round builds one implementation's state, warms it up, times a few steps and frees it, and
the order rotates from round to round, so that load from other processes hits all alike. The
table gives the median step time, the ratio to the fastest Adam, the achieved bandwidth (bytes
the update must move, over the median time) also as a fraction of a plain copy's bandwidth
measured in the same rounds, the peak extra memory of one step and the optimizer state it holds.

    python scripts/benchmark.py --quick                 # tiny only, a few seconds of timing
    python scripts/benchmark.py --sizes tiny base       # the CPU default
    python scripts/benchmark.py --device cuda --sizes base large
    python scripts/benchmark.py --e2e 200               # also fairseq-train ms/update, adam vs recadam
    python scripts/benchmark.py --llrd --sizes tiny     # recadam with --layer-lr-decay's scales vs without
    python scripts/benchmark.py --sizes 25M --layouts flat --threads 2 --impls recadam recadam-ewc
                                                        # one flat tensor of 25M elements: EWC's step vs RecAdam's
    python scripts/benchmark.py --doc docs/performance.md   # also the summary table into that page

The summary table goes between the ``<!-- benchmark:start -->`` / ``<!-- benchmark:end -->`` lines
of ``--doc`` (make bench: docs/performance.md).

Implementations: recadam (the fused one-pass torch.compile'd update; compile time excluded,
it happens in the warm-up), recadam-foreach (the eager multi-tensor reference),
recadam-single (the eager per-tensor loop), recadam-bf16-anchor (fused, θ* in bf16),
recadam-ewc (EWC's per-element pull γ·F·(θ−θ*): one more state tensor F, read in the fused update's pass);
recadam-llrd and recadam-foreach-llrd (with --llrd) the same as recadam / recadam-foreach with
layer-wise lr decay's per-layer scales (per tensor, or element runs of the flat tensor);
recadam-combo and recadam-cudagraph (per-tensor layout, GPU) the multi-tensor program with inductor's
horizontal fusion / replayed as a CUDA graph; recadam-cudagraph-all with the small tensors in it too.
"""

import argparse
import gc
import json
import logging
import os
import sys
import time

import torch

from recadam_fairseq.bench.e2e import e2e_table, run_e2e
from recadam_fairseq.bench.optimizers import ADAM_HP, DEFAULT_IMPLS, IMPLS, LLRD, RECADAM_HP
from recadam_fairseq.bench.tables import (MEMORY_METHODS, README_END, README_START, compile_notes, distance_notes,
                                          ewc_notes, llrd_notes, machine_info, render_report, summarize,
                                          summary_table, update_doc)
from recadam_fairseq.bench.timing import available_bytes, benchmark_workload, bytes_needed
from recadam_fairseq.bench.workloads import SIZES, build_workload, flat_elements
from recadam_fairseq.tools import readme_block


def settle_heap() -> None:
    """Load what optimizers import lazily (torch._dynamo, fairseq), then freeze the heap so the
    gc.collect() after each implementation scans only new objects (seconds less per run)."""
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    import fairseq.optim.adam  # noqa: F401

    gc.collect()
    gc.freeze()


def parse_args(argv=None):
    summary, details = __doc__.split("\n\n", 1)
    ap = argparse.ArgumentParser(description=summary, epilog=details,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", metavar="SIZE",
                    help=f"model sizes: {', '.join(SIZES)}, or a flat tensor of N million elements as NM (25M: "
                         f"with --layouts flat) (default: tiny base on CPU, tiny base large on CUDA)")
    ap.add_argument("--layouts", nargs="+", choices=["flat", "per-tensor"], default=["flat", "per-tensor"],
                    help="flat: one 1-D tensor (fairseq --fp16); per-tensor: RoBERTa's shapes (default: both)")
    ap.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(DEFAULT_IMPLS),
                    help="implementations to time (default: all but the -llrd ones); a copy is always timed as the "
                         "reference")
    ap.add_argument("--llrd", action="store_true",
                    help="time recadam and recadam-foreach with --layer-lr-decay's per-layer lr scales against "
                         "without (replaces --impls); the ratios are printed below the table")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cuda when available (default)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a busy small machine more threads stall)")
    ap.add_argument("--rounds", type=int, default=5, help="round-robin passes over the implementations")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation per round")
    ap.add_argument("--min-steps", type=int, default=3, help="timed steps per implementation per round, at least")
    ap.add_argument("--max-steps", type=int, default=100, help="timed steps per implementation per round, at most")
    ap.add_argument("--round-time", type=float, default=0.3,
                    help="seconds of timed steps per implementation per round to aim for")
    ap.add_argument("--e2e", type=int, default=0, metavar="UPDATES",
                    help="also time fairseq-train on the tiny generated RoBERTa (CPU), adam vs recadam, "
                         "UPDATES updates per run (0: skip, the default)")
    ap.add_argument("--e2e-rounds", type=int, default=3, help="fairseq-train runs per optimizer (alternating)")
    readme_block.add_doc_option(ap, "also write the summary table into PATH between its <!-- benchmark:start/end --> "
                                 "markers (make bench: docs/performance.md)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny size, 3 short rounds (well under 30 s on CPU): a smoke test")
    ap.add_argument("--out-md", default="bench.md", help="markdown report (default: bench.md)")
    ap.add_argument("--out-json", default="bench.json", help="JSON results (default: bench.json)")
    args = ap.parse_args(argv)
    for size in args.sizes or []:
        try:
            flat = flat_elements(size) is not None
        except ValueError as e:
            ap.error(f"--sizes: {e}")
        if flat and (args.llrd or args.layouts != ["flat"]):
            ap.error(f"--sizes {size}: a number of elements has no model's tensors (shapes, layers): it needs "
                     f"--layouts flat, without --llrd")
    args.doc = readme_block.doc_target(ap, args, README_START, README_END)  # before timing
    args.warmup = max(1, args.warmup)  # the first step allocates the state; its time sizes a round
    if args.llrd:
        args.impls = [x for pair in LLRD.items() for x in pair[::-1]]
    if args.quick:
        args.sizes, args.rounds, args.warmup, args.round_time = ["tiny"], 3, 1, 0.05
        args.min_steps, args.max_steps = 3, 30
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available")
    torch.set_num_threads(args.threads)
    settle_heap()
    logging.getLogger("filelock").setLevel(logging.WARNING)  # inductor's cache locks, once per kernel
    sizes = args.sizes or (["tiny", "base", "large"] if device.type == "cuda" else ["tiny", "base"])
    info = machine_info(device, args.threads)
    print(f"machine: {info['machine']} | device: {device.type} | torch {info['torch']} | "
          f"threads: {info['threads']}", flush=True)

    rows, notes, started = [], [], time.perf_counter()

    def save(rows, notes, e2e, partial: str = "") -> str:
        """The report and JSON so far: rewritten after every workload, so a run stopped at a time limit
        keeps what finished (``partial`` says what is missing)."""
        report = render_report(info, rows, notes)
        if partial:
            report = f"**Partial: {partial}.**\n\n" + report
        if e2e:
            report += (f"\n## End to end: fairseq-train on the tiny generated RoBERTa (CPU, {args.threads} thread(s))\n\n"
                       f"{e2e_table(e2e)}\n\nWall time per update from fairseq's updates/s (ups) over each log interval "
                       f"after the first, fp32; recadam includes its metrics on log steps. This model is far below the "
                       f"fused update's auto threshold, so recadam runs the eager update here.\n")
        with open(args.out_md, "w") as f:
            f.write(report)
        with open(args.out_json, "w") as f:
            json.dump(dict(machine=info, hyperparameters=dict(adam=ADAM_HP, recadam=RECADAM_HP),
                           memory_methods=MEMORY_METHODS, rounds=args.rounds, warmup=args.warmup, rows=rows,
                           notes=notes, e2e=e2e, complete=not partial), f, indent=2)
        return report

    todo = [(size, layout) for size in sizes for layout in args.layouts]
    for size in sizes:
        need, avail = bytes_needed(size), available_bytes(device)
        if need > 0.8 * avail:
            notes.append(f"{size}: skipped, needs ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available")
            print(notes[-1], flush=True)
            continue
        for layout in args.layouts:
            t = time.perf_counter()
            w = build_workload(layout, size, device)
            results = benchmark_workload(w, args.impls, args, device)
            rows += summarize(w, results)
            notes += compile_notes(w, results)
            print(f"{layout}/{size} ({w.numel / 1e6:.2f}M elements): {time.perf_counter() - t:.1f} s", flush=True)
            del w, results
            gc.collect()
            todo.remove((size, layout))
            if todo:
                save(rows, notes, [], partial="not yet run: " + ", ".join(f"{lay}/{sz}" for sz, lay in todo))
    notes = llrd_notes(rows) + ewc_notes(rows) + distance_notes(rows) + notes
    e2e = []
    if args.e2e:
        print(f"end to end: fairseq-train, {args.e2e} updates x {args.e2e_rounds} runs per optimizer", flush=True)
        e2e = run_e2e(args.e2e, args.e2e_rounds, args.threads)
    notes.append(f"total time {time.perf_counter() - started:.0f} s")

    report = save(rows, notes, e2e)
    print("\n" + report)
    if args.doc:
        link = os.path.relpath(os.path.abspath(args.out_md), os.path.dirname(os.path.abspath(args.doc)))
        update_doc(args.doc, summary_table(info, rows, e2e, full_table=args.out_md, link=link.replace(os.sep, "/")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
