"""The benchmark's report: rows per implementation, the markdown tables and their notes, the summary block of
docs/performance.md."""

import os
import platform
import statistics
from typing import Dict, List, Optional

import torch

from recadam_fairseq.bench.optimizers import ADAMS, ADAM_HP, COPY, DISTANCE, EWC, LLRD, RECADAM_HP, bytes_per_step
from recadam_fairseq.bench.timing import Samples
from recadam_fairseq.bench.workloads import LLRD_GAMMA, WORD, Workload
from recadam_fairseq.tools import readme_block


def summarize(w: Workload, results: Dict[str, Samples]) -> List[dict]:
    medians = {n: statistics.median(s.times) for n, s in results.items() if s.times}
    adams = [medians[n] for n in ADAMS if n in medians]
    fastest_adam = min(adams) if adams else None
    copy_gbps = bytes_per_step(COPY, w) / medians[COPY] / 1e9 if COPY in medians else None
    rows = []
    for name, s in results.items():
        row = dict(layout=w.layout, size=w.size, numel=w.numel, anchored=w.anchored, impl=name)
        if s.skipped or not s.times:
            row["skipped"] = s.skipped or "no samples"
            rows.append(row)
            continue
        med = medians[name]
        q = statistics.quantiles(s.times, n=4) if len(s.times) > 1 else [med, med, med]
        gbps = bytes_per_step(name, w) / med / 1e9
        row.update(
            median_ms=med * 1e3,
            iqr_pct=100 * (q[2] - q[0]) / med,
            samples=len(s.times),
            ratio_vs_fastest_adam=(med / fastest_adam) if fastest_adam and name not in (COPY, DISTANCE) else None,
            gbps=gbps,
            copy_fraction=gbps / copy_gbps if copy_gbps else None,
            peak_extra_mb=None if s.peak is None else s.peak / 2**20,
            state_mb=None if s.state is None else s.state / 2**20,
            peak_method=s.peak_method,
        )
        if name == DISTANCE and "recadam" in medians:
            row["fraction_of_recadam_step"] = med / medians["recadam"]
        rows.append(row)
    return rows


def fmt(x, spec: str, none: str = "—") -> str:
    return none if x is None else format(x, spec)


def markdown_table(rows: List[dict]) -> str:
    head = ["layout", "size (elements)", "impl", "median ms", "IQR %", "vs fastest Adam",
            "GB/s", "of copy BW", "peak extra MB", "state MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        size = f"{r['size']} ({r['numel'] / 1e6:.2f}M)"
        if "skipped" in r:
            cells = [r["layout"], size, r["impl"], f"skipped ({r['skipped']})"] + [""] * 6
        else:
            ratio = fmt(r["ratio_vs_fastest_adam"], ".2f")
            cells = [r["layout"], size, r["impl"], f"{r['median_ms']:.3f}", f"{r['iqr_pct']:.0f}",
                     ratio if ratio == "—" else ratio + "x", f"{r['gbps']:.2f}",
                     fmt(r["copy_fraction"], ".2f"), fmt(r["peak_extra_mb"], ".1f"), fmt(r.get("state_mb"), ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_info(device: torch.device, threads: int) -> dict:
    info = dict(torch=torch.__version__, python=platform.python_version(), device=device.type,
                threads=torch.get_num_threads(), requested_threads=threads, cpus=os.cpu_count())
    if device.type == "cuda":
        info["machine"] = torch.cuda.get_device_name(device)
    else:
        info["machine"] = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                info["machine"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return info


HOW_TO_READ = """\
How to read this:
- impl: recadam is the fast path (fused=True, the default from 4M elements: each large
  contiguous segment in one torch.compile'd pass; compiling happens in the warm-up and is
  reported below the table; separate tensors of one group in one compiled call),
  recadam-per-call the same with one compiled call per tensor (the per-tensor layout's cost
  before the multi-tensor call), recadam-foreach the eager multi-tensor reference, recadam-single
  the eager per-tensor loop, recadam-bf16-anchor the fast path with θ* stored in bf16,
  recadam-ewc EWC's pull with a heavy-tailed F (one more state word per anchored element, read in the fused step);
  recadam-llrd / recadam-foreach-llrd (--llrd) those two with layer-wise lr decay's scales;
  recadam-combo (--impls) the multi-tensor program with inductor's combo kernels (GPU);
  recadam-cudagraph (--impls) that program replayed as a CUDA graph (GPU; the same as recadam elsewhere),
  recadam-cudagraph-all (--impls) with the small tensors in it too;
  fairseq-adam and torch-adamw-* are the Adams to beat.
- median ms: median wall time of one optimizer.step() over all timed steps of all rounds (after
  warm-up); rounds rotate the order of implementations so that other load hits all alike.
  IQR % is the interquartile range over that median: large values mean a noisy machine.
- vs fastest Adam: step time over the fastest of fairseq-adam / torch-adamw-foreach /
  torch-adamw-fused at the same layout and size. RecAdam must move 8/7 of Adam's bytes
  (it also reads θ*), so ~1.14x is its bound against an equally efficient Adam (~1.07x bf16 θ*).
- GB/s: bytes the update must move (Adam 7 words per element: read p, g, m, v, write p, m, v;
  RecAdam +1 word per anchored element, +1/2 with a bf16 θ*, recadam-ewc +2 (θ* and F); copy 2 words; anchor_distance()
  2 words per anchored element) over the median time. Temporaries are not counted, so an
  implementation that makes extra passes shows a lower fraction of the copy's bandwidth.
- of copy BW: that bandwidth over a dst.copy_(src) of the same element count measured in the
  same rounds: a practical reference for a memory-bound update on this machine. A fused kernel
  can exceed 1.0: the copy's destination is read before it is written (write-allocate), so the
  copy really moves ~3 words, while an in-place update reads what it writes anyway. tiny
  (8 MB a tensor) may fit in the last-level cache; base and large stream from memory.
- peak extra MB: the most memory held during one step beyond what was held before it
  (the moments already exist): the step's temporaries. Method: {method}.
- state MB: the optimizer's state tensors, held between steps (Adam: m, v; RecAdam: + θ*; EWC: + F).
- anchor_distance(): Σ(θ−θ*)² that fairseq computes on log steps only; its cost relative to a
  recadam step is given below the table."""

MEMORY_METHODS = {
    "cuda-max-allocated": "torch.cuda.max_memory_allocated() minus memory_allocated() before the step",
    "profiler-alloc-timeline": "torch.profiler (profile_memory=True): running sum of every CPU tensor "
                               "allocation and free during one step, in time order; counts tensor bytes "
                               "from torch's allocator only, not allocator caching or fragmentation",
    "profiler-self-alloc-sum": "torch.profiler (profile_memory=True): sum of the bytes each op allocated, "
                               "ignoring frees (an upper bound)",
}


def render_report(info: dict, rows: List[dict], notes: List[str]) -> str:
    head = (f"# Optimizer step benchmark\n\nmachine: {info['machine']} ({info['cpus']} CPUs) | "
            f"device: {info['device']} | torch {info['torch']} | threads: {info['threads']} | "
            f"python {info['python']}\n\nhyperparameters: {ADAM_HP}, RecAdam {RECADAM_HP}\n\n")
    body = markdown_table(rows)
    extra = "\n".join(f"- {n}" for n in notes)
    methods = sorted({r["peak_method"] for r in rows if r.get("peak_method")}) or ["none measured"]
    how = HOW_TO_READ.format(method="; ".join(MEMORY_METHODS.get(m, m) for m in methods))
    return f"{head}{body}\n\n{extra}\n\n{how}\n" if extra else f"{head}{body}\n\n{how}\n"


def compile_notes(w: Workload, results: Dict[str, Samples]) -> List[str]:
    """The fused update's first step includes compiling it (per process; cached on disk after)."""
    res = results.get("recadam")
    if not res or res.first_step is None or not res.times:
        return []
    return [f"{w.layout}/{w.size}: first recadam step {res.first_step:.1f} s (compiling the fused update, "
            f"once per process; inductor's on-disk cache shortens later runs), then {1e3 * statistics.median(res.times):.1f} ms"]


def measured(rows: List[dict]) -> Dict[tuple, dict]:
    """{(layout, size, impl): row} of the rows with timings (not skipped)."""
    return {(r["layout"], r["size"], r["impl"]): r for r in rows if "median_ms" in r}


def llrd_notes(rows: List[dict]) -> List[str]:
    """The step with --layer-lr-decay's scales over the same step without them."""
    by = measured(rows)
    out = []
    for (layout, size, impl), r in by.items():
        base = by.get((layout, size, LLRD.get(impl)))
        if base:
            out.append(f"{layout}/{size}: {impl} {r['median_ms']:.2f} ms = {r['median_ms'] / base['median_ms']:.2f}x "
                       f"{base['impl']} ({base['median_ms']:.2f} ms): layer-wise lr decay (γ {LLRD_GAMMA}) vs none")
    return out


def ewc_notes(rows: List[dict]) -> List[str]:
    """EWC's step and state against RecAdam's eager step and its fused one (which EWC runs, F read in its pass)."""
    by = measured(rows)
    out = []
    for (layout, size, impl), r in by.items():
        base, fast = by.get((layout, size, "recadam-foreach")), by.get((layout, size, "recadam"))
        if impl != EWC or not (base or fast):
            continue
        ratios = [f"{r['median_ms'] / b['median_ms']:.2f}x {b['impl']} ({why})"
                  for b, why in ((base, "RecAdam's eager step"), (fast, "the fused step EWC runs")) if b]
        note = f"{layout}/{size}: recadam-ewc {r['median_ms']:.2f} ms = {', '.join(ratios)}"
        base = base or fast
        if r.get("state_mb") is not None and base.get("state_mb") is not None:
            note += (f"; state {r['state_mb']:.1f} MB against {base['state_mb']:.1f} MB: F adds "
                     f"{r['state_mb'] - base['state_mb']:.1f} MB ({r['anchored'] * WORD / 2**20:.1f} MB = one fp32 word "
                     f"per anchored element)")
        out.append(note)
    return out


def distance_notes(rows: List[dict]) -> List[str]:
    return [f"{r['layout']}/{r['size']}: anchor_distance() takes {r['median_ms']:.2f} ms = "
            f"{100 * r['fraction_of_recadam_step']:.0f}% of a recadam step"
            for r in rows if r.get("fraction_of_recadam_step") is not None]


README_START, README_END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"
SUMMARY_IMPLS = ("recadam", "recadam-foreach", "fairseq-adam", "torch-adamw-foreach", "torch-adamw-fused")


def summary_table(info: dict, rows: List[dict], e2e: List[dict], full_table: str = "docs/benchmark.md",
                  link: Optional[str] = None) -> str:
    """The summary for docs/performance.md: step time (ratio to the fastest Adam) per layout and size.
    ``full_table`` names the full report (--out-md); ``link`` is its path relative to the page."""
    by = measured(rows)
    cases = list(dict.fromkeys((r["layout"], r["size"], r["numel"]) for r in rows))
    head = ["layout", "size"] + list(SUMMARY_IMPLS) + ["peak temporaries: recadam / fairseq-adam"]
    lines = [f"Measured by `make bench` on {info['machine']} ({info['device']}, {info['threads']} thread(s), "
             f"torch {info['torch']}); full table: [{full_table}]({link or full_table}).", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for layout, size, numel in cases:
        cells = [layout, f"{size} ({numel / 1e6:.1f}M)"]
        for impl in SUMMARY_IMPLS:
            r = by.get((layout, size, impl))
            cells.append("—" if r is None else f"{r['median_ms']:.1f} ms ({r['ratio_vs_fastest_adam']:.2f}x)")
        mem = [by.get((layout, size, i)) for i in ("recadam", "fairseq-adam")]
        cells.append(" / ".join("—" if r is None or r["peak_extra_mb"] is None else f"{r['peak_extra_mb']:.0f} MB"
                                for r in mem))
        lines.append("| " + " | ".join(cells) + " |")
    if e2e:
        lines += ["", "End to end, `fairseq-train` on the tiny generated RoBERTa (fp32): " + ", ".join(
            f"{r['optimizer']} {r['ms_per_update']:.1f} ms/update ({r['ratio_vs_adam']:.2f}x)" for r in e2e) + "."]
    return "\n".join(lines)


def update_doc(path: str, text: str, flag: str = "--doc") -> None:
    """Replace what lies between the benchmark markers of ``path`` (docs/performance.md)."""
    readme_block.replace_block(path, README_START, README_END, text, flag=flag)
