"""Timing and memory: steps timed in rounds, the peak extra memory of one step, the state an optimizer holds."""

import gc
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from recadam_fairseq.bench.optimizers import BUILDERS, COPY, DISTANCE
from recadam_fairseq.bench.workloads import WORD, Workload, size_numel


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
