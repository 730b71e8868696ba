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
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from recadam_fairseq import catalogue
from recadam_fairseq.core import layer_lr
from recadam_fairseq.core.recadam import RecAdam
from recadam_fairseq.engine.fairseq_log import parse_log_lines
from recadam_fairseq.tools import readme_block, tiny_train

# (layers, dim, ffn, vocab) of RoBERTa-like encoders.
SIZES = {
    "tiny": (2, 128, 512, 12000),
    "base": (12, 768, 3072, 50265),
    "large": (24, 1024, 4096, 50265),
}
MAX_POSITIONS = 514
NUM_CLASSES = 2
FLAT_HEAD_FRACTION = 0.001  # the unanchored tail of the flat layout (a classifier head)

ADAM_HP = dict(lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
# λ(t) and the pull both run every step (pull = lr·(w−λ)·γ = 0.05). At these early steps λ ≈ 0
# (t ≪ t0), but the kernels do not depend on its value (timed the same as with λ ≈ 0.5).
RECADAM_HP = dict(anneal_fun="sigmoid", anneal_k=0.1, anneal_t0=1000.0, anneal_w=1.0, pretrain_cof=5000.0)

ADAMS = ("fairseq-adam", "torch-adamw-foreach", "torch-adamw-fused")
LLRD = {"recadam-llrd": "recadam", "recadam-foreach-llrd": "recadam-foreach"}  # timed against
LLRD_GAMMA = 0.9
EWC = "recadam-ewc"  # RecAdam with a heavy-tailed F (set_fisher): the fused step, F read in its pass
DEFAULT_IMPLS = ("recadam", "recadam-per-call", "recadam-foreach", "recadam-single", "recadam-bf16-anchor",
                 EWC) + ADAMS
COMBO = "recadam-combo"  # the multi-tensor program with inductor's horizontal fusion (per-tensor layout, GPU)
GRAPHED = "recadam-cudagraph"  # the multi-tensor program replayed as a CUDA graph (per-tensor layout, GPU)
GRAPHED_ALL = "recadam-cudagraph-all"  # the same with every tensor, the small ones too, in that program
IMPLS = DEFAULT_IMPLS + tuple(LLRD) + (COMBO, GRAPHED, GRAPHED_ALL)
RECADAMS = ("recadam", "recadam-per-call", "recadam-foreach", "recadam-single", "recadam-bf16-anchor", EWC, COMBO,
            GRAPHED, GRAPHED_ALL) + tuple(LLRD)
COPY, DISTANCE = "copy", "anchor_distance()"
WORD = 4  # bytes of an fp32 element


# ----------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    layout: str
    size: str
    params: List[torch.Tensor]  # fp32, each with .grad set
    anchors: List[Optional[torch.Tensor]]  # fp32 θ* per parameter, None for the unanchored head
    runs: Optional[list]  # anchored element runs of the flat tensor
    numel: int
    anchored: int


def roberta_shapes(layers: int, dim: int, ffn: int, vocab: int):
    """(shape, anchored) of a RoBERTa encoder's tensors, then a 2-layer classification head."""
    shapes = [((vocab, dim), True), ((MAX_POSITIONS, dim), True), ((dim,), True), ((dim,), True)]
    for _ in range(layers):
        for _qkvo in range(4):
            shapes += [((dim, dim), True), ((dim,), True)]
        shapes += [((dim,), True), ((dim,), True)]  # self-attention layer norm
        shapes += [((ffn, dim), True), ((ffn,), True), ((dim, ffn), True), ((dim,), True)]
        shapes += [((dim,), True), ((dim,), True)]  # final layer norm
    shapes += [((dim, dim), False), ((dim,), False), ((NUM_CLASSES, dim), False), ((NUM_CLASSES,), False)]
    return shapes


def roberta_names(layers: int) -> List[str]:
    """The parameter names of ``roberta_shapes``, in its order."""
    enc = "encoder.sentence_encoder."
    names = [enc + n for n in ("embed_tokens.weight", "embed_positions.weight", "layernorm_embedding.weight",
                                 "layernorm_embedding.bias")]
    layer = [f"self_attn.{x}_proj.{y}" for x in ("q", "k", "v", "out") for y in ("weight", "bias")]
    layer += [f"{m}.{y}" for m in ("self_attn_layer_norm", "fc1", "fc2", "final_layer_norm") for y in ("weight", "bias")]
    names += [f"{enc}layers.{i}.{n}" for i in range(layers) for n in layer]
    return names + [f"classification_heads.h.{m}.{y}" for m in ("dense", "out_proj") for y in ("weight", "bias")]


def llrd_scales(w: "Workload", gamma: float = LLRD_GAMMA) -> list:
    """--layer-lr-decay's scale of each workload tensor (flat: element runs per layer), from core/layer_lr.py."""
    layers = SIZES[w.size][0]
    names, shapes = roberta_names(layers), [s for s, _ in roberta_shapes(*SIZES[w.size])]
    scale_of = layer_lr.name_scales(names, gamma, layers)
    if w.layout == "flat":
        parts, off = [], 0
        for n, shape in zip(names, shapes):
            parts.append((n, off, math.prod(shape)))
            off += math.prod(shape)
        return layer_lr.tensor_scales([parts], scale_of)
    return layer_lr.tensor_scales([[(n, 0, math.prod(shape))] for n, shape in zip(names, shapes)], scale_of)


def size_numel(size: str) -> int:
    return sum(math.prod(s) for s, _ in roberta_shapes(*SIZES[size]))


def random_like_weights(shape, device, gen) -> torch.Tensor:
    return torch.empty(shape, device=device).uniform_(-0.05, 0.05, generator=gen)


def build_workload(layout: str, size: str, device: torch.device, seed: int = 0) -> Workload:
    """Parameters (θ* plus a small drift, so the pull has work), gradients and fp32 anchors."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = roberta_shapes(*SIZES[size])
    if layout == "flat":
        n = sum(math.prod(s) for s, _ in shapes)
        n_anchored = n - max(1, round(n * FLAT_HEAD_FRACTION))
        shapes = [((n,), True)]
    params, anchors = [], []
    for shape, anchored in shapes:
        p = random_like_weights(shape, device, gen)
        p.grad = random_like_weights(shape, device, gen).mul_(0.1)
        anchor = None
        if anchored:
            anchor = (p[:n_anchored] if layout == "flat" else p).detach().clone()
            p.add_(random_like_weights(shape, device, gen), alpha=0.01)
        params.append(p)
        anchors.append(anchor)
    numel = sum(p.numel() for p in params)
    anchored = sum(a.numel() for a in anchors if a is not None)
    runs = [(0, anchored)] if layout == "flat" else None
    return Workload(layout, size, params, anchors, runs, numel, anchored)


# ----------------------------------------------------------------------------- implementations
def heavy_tailed_fisher(anchor: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A stand-in for a diagonal Fisher: positive, mean 1, heavy-tailed (a cubed exponential: its largest
    entries ~10^3 times the mean; docs/ewc.md's task Fishers reach 10^5, which the step's cost ignores)."""
    gen = torch.Generator(device=anchor.device).manual_seed(seed)
    f = torch.empty(anchor.shape, device=anchor.device).exponential_(generator=gen).pow_(3)
    return f.div_(f.mean())


def build_recadam(w: Workload, foreach: bool = True, fused: bool = True, anchor_dtype=None,
                  llrd: bool = False, fisher: bool = False) -> RecAdam:
    opt = RecAdam(w.params, **ADAM_HP, **RECADAM_HP, foreach=foreach, fused=fused and foreach, defer_anchors=True)
    for i, (p, a) in enumerate(zip(w.params, w.anchors)):
        if a is not None:
            opt.set_anchor(p, a if anchor_dtype is None else a.to(anchor_dtype), w.runs)
            if fisher:
                opt.set_fisher(p, heavy_tailed_fisher(a, seed=i))
    if llrd:
        for p, scale in zip(w.params, llrd_scales(w)):
            opt.set_lr_scale(p, scale)
    return opt


class PerCall:
    """recadam with one compiled call per tensor (the multi-tensor call off): what the per-tensor
    layout cost before ``fused.update_many``; the same as recadam on the flat layout."""

    def __init__(self, w: Workload):
        self.opt = build_recadam(w)

    def step(self):
        from recadam_fairseq.core import fused

        saved, fused.MULTI_MIN_SEGMENTS = fused.MULTI_MIN_SEGMENTS, 1 << 62
        try:
            self.opt.step()
        finally:
            fused.MULTI_MIN_SEGMENTS = saved


class FusedSettings:
    """recadam with some of fused.py's module settings (``settings``) set around each step."""

    settings: dict = {}

    def __init__(self, w: Workload):
        self.opt = build_recadam(w)

    def step(self):
        from recadam_fairseq.core import fused

        saved = {name: getattr(fused, name) for name in self.settings}
        for name, value in self.settings.items():
            setattr(fused, name, value)
        try:
            self.opt.step()
        finally:
            for name, value in saved.items():
                setattr(fused, name, value)


class Combo(FusedSettings):
    """recadam whose multi-tensor program is compiled with inductor's combo kernels (horizontal fusion
    of the per-tensor kernels into few launches, Triton only): whether it pays is for the GPU to say."""

    settings = dict(MANY_OPTIONS={"combo_kernels": True})


class Graphed(FusedSettings):
    """recadam whose multi-tensor program is captured once in a CUDA graph and replayed (fused.CUDA_GRAPH):
    the workload's gradients stay where they are, as a training loop's do when the allocator hands the
    backward pass the same blocks each step. The same as recadam on the CPU and on the flat layout."""

    settings = dict(CUDA_GRAPH=True)


class GraphedAll(FusedSettings):
    """recadam-cudagraph with the small tensors in the graph too (no eager _foreach_ kernels, whose host time
    is then what is left; each small tensor adds a graph node of GPU time instead)."""

    settings = dict(CUDA_GRAPH=True, MIN_SEGMENT=1)


def build_fairseq_adam(w: Workload):
    from fairseq.optim.adam import Adam

    return Adam(w.params, **ADAM_HP)


class CopyStep:
    """``dst.copy_(src)`` of the workload's element count: the bandwidth reference."""

    def __init__(self, w: Workload):
        device = w.params[0].device
        self.src = torch.ones(w.numel, device=device)
        self.dst = torch.zeros(w.numel, device=device)

    def step(self):
        self.dst.copy_(self.src)


BUILDERS: Dict[str, Callable] = {
    "recadam": build_recadam,
    "recadam-per-call": PerCall,
    COMBO: Combo,
    GRAPHED: Graphed,
    GRAPHED_ALL: GraphedAll,
    "recadam-foreach": lambda w: build_recadam(w, fused=False),
    "recadam-single": lambda w: build_recadam(w, foreach=False),
    "recadam-bf16-anchor": lambda w: build_recadam(w, anchor_dtype=torch.bfloat16),
    EWC: lambda w: build_recadam(w, fisher=True),
    "recadam-llrd": lambda w: build_recadam(w, llrd=True),
    "recadam-foreach-llrd": lambda w: build_recadam(w, fused=False, llrd=True),
    "fairseq-adam": build_fairseq_adam,
    "torch-adamw-foreach": lambda w: torch.optim.AdamW(w.params, **ADAM_HP, foreach=True),
    "torch-adamw-fused": lambda w: torch.optim.AdamW(w.params, **ADAM_HP, fused=True),
    COPY: CopyStep,
}


def bytes_per_step(name: str, w: Workload) -> int:
    """Bytes a step must move at least: Adam reads p, g, m, v and writes p, m, v (7 words per
    element); RecAdam also reads θ* on anchored elements (and EWC's F); a copy reads and writes one word."""
    if name == COPY:
        return 2 * WORD * w.numel
    if name == DISTANCE:  # reads θ and θ* on anchored elements
        return 2 * WORD * w.anchored
    anchor_bytes = {"recadam-bf16-anchor": 2, EWC: 2 * WORD}.get(name, WORD if name in RECADAMS else 0)
    return 7 * WORD * w.numel + anchor_bytes * w.anchored


# ----------------------------------------------------------------------------- measuring
def synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def time_calls(fn: Callable, n: int, sync: Callable) -> List[float]:
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return times


def peak_extra_bytes(fn: Callable, device: torch.device):
    """(bytes, method): the most memory held during fn beyond what was held before it."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - before, "cuda-max-allocated"
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:  # every allocation and free, in time order (frees outside any op included)
        from torch._C._profiler import _EventType

        events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
        held = peak = 0
        for _, delta in sorted(events):
            held += delta
            peak = max(peak, held)
        return peak, "profiler-alloc-timeline"
    except (ImportError, AttributeError):  # private API gone: allocations only, an upper bound
        total = sum(max(0, e.self_cpu_memory_usage) for e in prof.key_averages())
        return total, "profiler-self-alloc-sum"


def state_bytes(opt) -> Optional[int]:
    """Bytes of the tensors an optimizer keeps between steps (moments, θ*, EWC's F), each storage once;
    None for what keeps no optimizer state (the copy)."""
    state = getattr(getattr(opt, "opt", opt), "state", None)
    if state is None:
        return None
    seen = {}
    for st in state.values():
        for v in st.values():
            if torch.is_tensor(v):
                seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    return sum(seen.values())


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def bytes_needed(size: str) -> int:
    """p, g, θ* shared; then per implementation m, v, a bf16 θ* and a model-sized temporary
    (torch's foreach AdamW and fairseq's Adam build the whole denominator on a flat tensor)."""
    return int(size_numel(size) * WORD * (3 + 3.5))


@dataclass
class Samples:
    times: List[float] = field(default_factory=list)
    peak: Optional[int] = None
    peak_method: Optional[str] = None
    skipped: Optional[str] = None
    first_step: Optional[float] = None  # the very first step (for the fused update: its compile)
    state: Optional[int] = None  # bytes of optimizer state (state_bytes)


def benchmark_workload(w: Workload, impls: List[str], args, device) -> Dict[str, Samples]:
    """Round-robin over the implementations (and the copy), one implementation's state at a time."""
    sync = synchronizer(device)
    names = list(impls) + [COPY]
    results = {n: Samples() for n in names}
    if "recadam" in impls:
        results[DISTANCE] = Samples()
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            res = results[name]
            if res.skipped:
                continue
            try:
                opt = BUILDERS[name](w)
                warm = time_calls(opt.step, args.warmup, sync)
                if res.first_step is None:
                    res.first_step = warm[0]
            except (RuntimeError, ValueError, TypeError) as e:  # e.g. fused AdamW on this device
                res.skipped = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                opt = None
                gc.collect()
                continue
            n = min(args.max_steps, max(args.min_steps, math.ceil(args.round_time / max(warm[-1], 1e-9))))
            res.times += time_calls(opt.step, n, sync)
            if res.peak is None:  # a step of its own: the profiler slows what it watches
                res.peak, res.peak_method = peak_extra_bytes(opt.step, device)
                res.state = state_bytes(opt)
            if name == "recadam":  # the metric fairseq computes on log steps
                dist = results[DISTANCE]
                dist.times += time_calls(lambda: opt.anchor_distance().item(), n, sync)
                if dist.peak is None:
                    dist.peak, dist.peak_method = peak_extra_bytes(lambda: opt.anchor_distance().item(), device)
            del opt
            gc.collect()
    return results


# ----------------------------------------------------------------------------- reporting
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


# ----------------------------------------------------------------------------- end to end
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
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


# ----------------------------------------------------------------------------- main
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
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES),
                    help="model sizes (default: tiny base on CPU, tiny base large on CUDA)")
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
