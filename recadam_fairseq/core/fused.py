"""The RecAdam update of one contiguous segment in one pass over memory (``torch.compile``).

Pure torch. The eager multi-tensor path in ``recadam_kernels.py`` makes about ten passes (one per
``_foreach_*`` op); here the whole per-element rule is one compiled loop that reads p, g, m, v
(and p* on anchored elements) once and writes p, m, v once: the bandwidth bound. The eager path
stays the reference: both evaluate the same expressions in the same order, so they agree up
to float rounding of contracted multiply-adds (the compiler may fuse ``a*b + c`` into one FMA).

The step-dependent scalars travel as one tensor (a 0-d Python float would be baked into the
compiled code and recompile every step); sizes are dynamic, so one compiled kernel per
(dtypes, anchored or not, EWC's F or not, device) serves every segment. With F (EWC) the pull's
weight is each element's min(pull·F, 1), capped inside the kernel as the eager path caps it: F is one
more word read per element, not another pass.
"""

import logging
import types
from typing import Optional, Sequence

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

HALF = (torch.float16, torch.bfloat16)  # computed in fp32
# Segments smaller than this stay on the eager path: a compiled call costs ~0.1 ms of Python.
MIN_SEGMENT = 1 << 16
# With fused=None (auto), groups with fewer elements stay eager: compiling takes seconds
# (once per process, less with inductor's on-disk cache) and only pays back on large models.
AUTO_MIN_NUMEL = 1 << 22


def _row(beta1: float, beta2: float, eps: float, adam_scale: float, pull: float, decay: float) -> list:
    """One step's scalars in the order ``_update`` reads them."""
    return [beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps, -adam_scale, pull, -decay]


def scalars(beta1: float, beta2: float, eps: float, adam_scale: float, pull: float, decay: float,
            dtype: torch.dtype, device: torch.device) -> Tensor:
    """The scalars of one step as one tensor, computed in double like the eager path's."""
    return torch.tensor(_row(beta1, beta2, eps, adam_scale, pull, decay), dtype=dtype).to(device, non_blocking=True)


def scalar_rows(rows: Sequence[dict], dtype: torch.dtype, device: torch.device) -> Tensor:
    """[n, 8]: row i the scalars of segment i (``scalars``' keyword dicts), for tensors whose lrs differ."""
    return torch.tensor([_row(**r) for r in rows], dtype=dtype).to(device, non_blocking=True)


def _update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, a: Optional[Tensor], s: Tensor,
            f: Optional[Tensor] = None) -> None:
    """Eager definition (what gets compiled); the eager foreach path computes the same.
    ``f``: EWC's F of the anchored elements (any float dtype, read in m's), None: F ≡ 1."""
    p32 = p.to(m.dtype)
    g32 = g.to(m.dtype)
    m_new = m * s[0] + g32 * s[1]
    v_new = v * s[2] + g32 * s[3] * g32  # as addcmul rounds value·g·g
    p_new = p32 + s[5] * (m_new / (v_new.sqrt() + s[4]))
    if a is not None:  # p ← p − pull·(p − p*), as torch.lerp rounds it; with F the weight min(pull·F, 1)
        w = s[6] if f is None else torch.clamp(f.to(m.dtype) * s[6], max=1.0)
        p_new = torch.lerp(p_new, a.to(m.dtype), w)
    p_new = p_new + s[7] * p_new
    m.copy_(m_new)
    v.copy_(v_new)
    p.copy_(p_new)


_kernels = {}


def _compiled(fn, cache: dict, key: tuple, what: str):
    """``fn`` compiled for one (dtypes, device) combination.

    Each combination gets its own code object, hence its own dynamo cache with a single entry:
    no search through other variants' guards on each call, and no recompile limit to reach.
    """
    kernel = cache.get(key)
    if kernel is None:
        logger.info(f"RecAdam: compiling {what} for {key} with torch.compile (once per process)")
        code = fn.__code__.replace(co_name=f"_recadam{fn.__name__}_{len(cache)}")
        kernel = cache[key] = torch.compile(types.FunctionType(code, fn.__globals__, code.co_name),
                                            dynamic=True, fullgraph=True)
    return kernel


def _kernel(key: tuple):
    """The compiled update for one (dtypes of p, g, p* or None, F or None; device) combination."""
    return _compiled(_update, _kernels, key, "the fused update")


def _distance(p: Tensor, a: Tensor) -> Tensor:
    """Σ(p − a)² of one segment in one pass (no temporary): fp32 differences, float64 sum."""
    d = p.float() - a.float()
    return (d * d).sum(dtype=torch.float64)


_distances = {}


def distance(p: Tensor, a: Tensor) -> Tensor:
    """Σ(p − p*)² of a contiguous 1-D segment with a compiled kernel (one per dtype pair and device)."""
    return _compiled(_distance, _distances, (p.dtype, a.dtype, p.device), "the fused distance")(p, a)


def available(device: torch.device) -> bool:
    """Whether torch.compile can be tried on this device (a failure later still falls back)."""
    if device.type not in ("cpu", "cuda"):
        return False
    try:
        import torch._dynamo

        return bool(torch._dynamo.is_dynamo_supported())
    except Exception:  # noqa: BLE001 - any import/probe failure means "not here"
        return False


def _fisher(segment: Sequence) -> Optional[Tensor]:
    """A segment's F: its sixth entry (a Segment's), None when it has none."""
    return segment[5] if len(segment) > 5 else None


def _dtype(x: Optional[Tensor]):
    return None if x is None else x.dtype


def update_segments(segments: Sequence[tuple], s: Tensor) -> None:
    """Apply the update to each (p, g, m, v, anchor or None[, F or None]) segment with the compiled kernel."""
    for seg in segments:
        p, g, m, v, a = seg[:5]
        f = _fisher(seg)
        _kernel((p.dtype, g.dtype, _dtype(a), _dtype(f), p.device))(p, g, m, v, a, s, f)


def _update_many(ps, gs, ms, vs, anchors, fishers, s: Tensor) -> None:
    """The update of many segments as one compiled program (the loop is unrolled when traced).
    ``s``: the scalars of all, or one row per segment (``scalar_rows``)."""
    for i, (p, g, m, v, a, f) in enumerate(zip(ps, gs, ms, vs, anchors, fishers)):
        _update(p, g, m, v, a, s[i] if s.dim() == 2 else s, f)


_many = {}
# A per-tensor layout hands the step one tensor per parameter (75 large ones in RoBERTa-base):
# compiled one at a time, each call pays dynamo's guards and a launch from Python (~0.1 ms on CPU),
# which on a GPU can cost more than the update itself. From this many segments, one compiled
# program updates them all (one call, one guard check); it compiles once per model structure.
MULTI_MIN_SEGMENTS = 4
# Each new set of tensors (e.g. other parameters without a gradient this step) compiles a new
# program; past this many per optimizer, further sets take one call per tensor instead.
MULTI_MAX_PROGRAMS = 8
# inductor options of the multi-tensor program; the benchmark's recadam-combo sets {"combo_kernels": True}
# (inductor's horizontal fusion of the per-tensor kernels, Triton only) to measure it on a GPU
MANY_OPTIONS: dict = {}
# Always: inductor's own size/stride asserts of each input repeat what dynamo's guards (static sizes) already
# checked, ~1 µs per tensor argument (~0.2 ms of host time a step at RoBERTa-base's 74 large tensors).
_MANY_BASE_OPTIONS = {"size_asserts": False}


def many_key(segments: Sequence[tuple]) -> tuple:
    """What a multi-tensor program is specialised to: dtypes (F's too), device and every segment's size."""
    p0, g0, _, _, a0 = segments[0][:5]
    return (p0.dtype, g0.dtype, _dtype(a0), _dtype(_fisher(segments[0])), p0.device,
            tuple(x[0].numel() for x in segments))


def update_many(segments: Sequence[tuple], s: Tensor, graph: Optional[bool] = None) -> None:
    """Apply the update to separate tensors' segments (p, g, m, v, anchor or None[, F or None] sharing
    dtypes, anchoredness and device) with one compiled call; ``s``: one set of scalars, or a row per segment;
    ``graph``: replay it as a CUDA graph on CUDA (None: ``CUDA_GRAPH``).
    Sizes are static: the key holds them, so each model structure gets its own code object and a
    single cache entry."""
    key = many_key(segments) + (s.dim(), tuple(sorted(MANY_OPTIONS.items())))
    kernel = _many.get(key)
    if kernel is None:
        logger.info(f"RecAdam: compiling the fused update of {len(segments)} tensors with torch.compile "
                    f"(once per model structure)")
        code = _update_many.__code__.replace(co_name=f"_recadam_update_many_{len(_many)}")
        kernel = _many[key] = torch.compile(types.FunctionType(code, _update_many.__globals__, code.co_name),
                                            dynamic=False, fullgraph=True,
                                            options={**_MANY_BASE_OPTIONS, **MANY_OPTIONS})
    args = [list(x) for x in zip(*((*seg[:5], _fisher(seg)) for seg in segments))]
    if (CUDA_GRAPH if graph is None else graph) and s.is_cuda:
        _graphed(kernel, key, args, s)
    else:
        kernel(*args, s)


# Opt-in, CUDA only (RecAdam(cuda_graph=True), --recadam-fused cuda-graph, the benchmark's recadam-cudagraph;
# timed on an H100 in pass 4 at 1.08x fused AdamW, not yet the default: in fairseq-train the gradients must keep
# their addresses for replays to happen; GPU pass 5 saw them move every step until FairseqRecAdam.zero_grad
# zeroed them in place under cuda-graph, which no GPU has run yet): the
# multi-tensor program captured once in a CUDA graph, then replayed while every tensor it reads and writes,
# the gradients included (not copied: that would be another pass over memory), sits where it sat at the
# capture: one replay instead of dynamo's guards and a launch per tensor. A replay computes what the
# compiled call would: the same kernels on the same addresses, with the scalars copied into the graph's own.
# No tensor is held: the addresses of a call's arguments are the graph's key, so a replay only ever runs on
# tensors alive at those addresses. Other addresses (a new optimizer, gradients allocated elsewhere) take
# the compiled call and a new capture; past MAX_GRAPHS the oldest capture goes, and past MAX_CAPTURES of
# one program (addresses that keep changing: a capture costs a device synchronisation) none is made.
CUDA_GRAPH = False
MAX_GRAPHS = 4
MAX_CAPTURES = 16
_captures: dict = {}  # program key -> captures made
_graphs: dict = {}  # (program key, the arguments' addresses) -> [graph, its scalars tensor, replays]
_uncapturable: set = set()  # program keys whose capture failed: not tried again


def _graphed(kernel, key: tuple, args: list, s: Tensor) -> None:
    where = (key, tuple(x.data_ptr() for column in args for x in column if x is not None))
    entry = _graphs.get(where)
    if entry is not None:
        entry[1].copy_(s)
        entry[0].replay()
        entry[2] += 1
        return
    kernel(*args, s)  # this step's update (and the compile, on the first call); the capture only records
    if key in _uncapturable or _captures.get(key, 0) >= MAX_CAPTURES:
        return
    _captures[key] = _captures.get(key, 0) + 1
    logger.info(f"RecAdam: CUDA graph capture {_captures[key]} of the {len(args[0])}-tensor program"
                + ("" if _captures[key] < MAX_CAPTURES else
                   f" (the last: its tensors keep moving, the compiled call goes on without a graph)"))
    try:
        s_graph = s.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel(*args, s_graph)
    except Exception as e:  # noqa: BLE001 - the update is done: a failed capture must not reach the eager fallback
        _uncapturable.add(key)
        logger.warning(f"RecAdam: the CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); "
                       f"the compiled call goes on without it")
        return
    if len(_graphs) >= MAX_GRAPHS:
        _graphs.pop(next(iter(_graphs)))
    _graphs[where] = [graph, s_graph, 0]
