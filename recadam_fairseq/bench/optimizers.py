"""What the benchmark times: RecAdam's implementations (fused, per call, foreach, single, bf16 θ*, EWC, LLRD,
the per-tensor layout's combo kernels and CUDA graphs), the Adams it is measured against, and a plain copy."""

from typing import Callable, Dict

import torch

from recadam_fairseq.bench.workloads import WORD, Workload, llrd_scales
from recadam_fairseq.core.recadam import RecAdam


ADAM_HP = dict(lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
# λ(t) and the pull both run every step (pull = lr·(w−λ)·γ = 0.05). At these early steps λ ≈ 0
# (t ≪ t0), but the kernels do not depend on its value (timed the same as with λ ≈ 0.5).
RECADAM_HP = dict(anneal_fun="sigmoid", anneal_k=0.1, anneal_t0=1000.0, anneal_w=1.0, pretrain_cof=5000.0)

ADAMS = ("fairseq-adam", "torch-adamw-foreach", "torch-adamw-fused")
LLRD = {"recadam-llrd": "recadam", "recadam-foreach-llrd": "recadam-foreach"}  # timed against
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
