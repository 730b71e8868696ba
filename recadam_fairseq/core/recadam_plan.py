"""Which elements each of RecAdam's kernel calls updates: a step's plan, and the caches it is made from.

Pure torch (no fairseq import). A group's step is a plan (:func:`make_plan`): the segments of its tensors
that have a gradient (a whole tensor, or a run of a flat tensor's elements with one anchor or none and one
lr scale), grouped by what one call needs them to share: buckets for the compiled kernels (one :class:`Kind`
and step t; large contiguous segments, taken whole) and for the eager ones (one Kind, t and lr scale; in
batches of at most CHUNK elements unless a tensor is taken whole). Each tensor's segments come from its
layout (:func:`_layout`), cached while its storage, state and lr scale stay the same; the plan, which names
the gradients by (tensor index, element span), is reused while its group's gradients, tensors and state stay
what they were (:meth:`_Plan.holds`). At RoBERTa-base's ~200 tensors, remaking either each step cost more
host time than a GPU spends on the update. What the kernels do with a plan: ``recadam_kernels.py``.
"""

import operator
from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from . import fused as _fused

# Elements per batch of work. Bounds every temporary (the Adam denominator, fp32 copies of
# half-precision tensors) to a few buffers of this size instead of the model's size.
CHUNK = 1 << 21
# State tensors whose dtype we keep on load (torch would cast them to the parameter dtype).
_STATE_TENSORS = ("exp_avg", "exp_avg_sq", "anchor", "fisher")
_COMPILED, _WHOLE, _CHUNKS = "compiled", "whole", "chunks"  # the routes of _layout's segments
_LAYOUT_STATE = ("exp_avg", "exp_avg_sq", "anchor", "fisher", "anchor_runs")  # what a layout is made of
_STEP = operator.itemgetter("step")
_FLAT = "flat"  # a plan's gradient span: the whole tensor, flattened


class Segment(NamedTuple):
    """Elements of one tensor as an update call takes them: the tensors themselves or flat views."""
    p: Tensor
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    anchor: Optional[Tensor]  # p* of these elements; None: plain Adam
    fisher: Optional[Tensor] = None  # EWC's F of these elements (laid out as the anchor); None: F ≡ 1


class Stored(NamedTuple):
    """A segment's tensors but its gradient: what a layout and a plan keep from step to step."""
    p: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    anchor: Optional[Tensor]
    fisher: Optional[Tensor]


class Kind(NamedTuple):
    """What segments share to be updated by one call, apart from their step t and lr scale."""
    anchored: bool  # pulled toward p* (an anchor, and anneal_w > 0)
    dtypes: Tuple[Optional[torch.dtype], ...]  # of p, grad, anchor and F (None: none)
    device: torch.device


class Chunk(NamedTuple):
    """A CHUNK-sized piece of a segment: elements [lo, hi) of the flattened tensor."""
    lo: int
    hi: int
    tensors: Stored


class Routed(NamedTuple):
    """One segment of a tensor's layout: elements [lo, hi) of the flattened tensor and the route they take."""
    route: str  # _COMPILED: one compiled call; _WHOLE: the tensors themselves; _CHUNKS: CHUNK-sized views
    lo: int
    hi: int
    kind: Kind
    scale: float  # the lr scale
    tensors: Optional[Stored]  # _COMPILED, _WHOLE: the segment's; _CHUNKS: None
    chunks: Tuple[Chunk, ...] = ()  # _CHUNKS: its pieces


class _CachedLayout(NamedTuple):
    """A tensor's layout and what it was made from (``_layout``'s cache)."""
    key: tuple  # p's storage, the gradient's dtype, the routing (fused, pulled) and its thresholds
    scale: Union[None, float, list]  # p's lr scale
    held: tuple  # p's state tensors in _LAYOUT_STATE's order (compared by identity)
    segments: List[Routed]


class Source(NamedTuple):
    """Where a plan's segment takes its gradient: tensor ``index`` of the group's, its elements ``span``."""
    index: int
    span: Union[None, str, Tuple[int, int]]  # None: the tensor itself; _FLAT: flattened; (lo, hi): [lo, hi) flat


class Entry(NamedTuple):
    """A plan's segment: its gradient by source, its lr scale, its other tensors."""
    source: Source
    scale: float
    tensors: Stored


def _views(x: Optional[Tensor], lo: int, hi: int) -> Optional[Tensor]:
    return None if x is None else x.view(-1)[lo:hi]


def _without_grad(seg: Segment) -> Stored:
    return Stored(seg.p, seg.exp_avg, seg.exp_avg_sq, seg.anchor, seg.fisher)


def _grad_signature(grads: list) -> list:
    """What a plan fixes of the gradients: which tensors have one, its dtype; False: not contiguous (or sparse)."""
    return [None if g is None else g.is_contiguous() and g.dtype for g in grads]


def _grads(grads: list, srcs: List[Source]) -> list:
    """The gradient views ``srcs`` name: the tensor itself, flattened, or elements [lo, hi)."""
    return [grads[i] if span is None else grads[i].view(-1) if span is _FLAT else grads[i].view(-1)[span[0]:span[1]]
            for i, span in srcs]


def _materialize(entry: Entry, grads: list) -> Segment:
    t = entry.tensors
    return Segment(t.p, _grads(grads, [entry.source])[0], t.exp_avg, t.exp_avg_sq, t.anchor, t.fisher)


class _CompiledBucket:
    """A plan's segments of one Kind and step for the compiled kernels: columns, the gradients named by source."""

    def __init__(self, step: int, kind: Kind, entries: List[Entry]):
        self.step, self.kind = step, kind
        self.srcs = [e.source for e in entries]
        self.scales = [e.scale for e in entries]
        self.unique_scales = list(dict.fromkeys(self.scales))
        self.ps, self.ms, self.vs, self.anchors, self.fishers = map(list, zip(*(e.tensors for e in entries)))
        self.separate = len({p.untyped_storage().data_ptr() for p in self.ps}) == len(self.ps)
        self.programs = {}  # (anchors dropped, scalars' dim) -> fused.many_key of the program


class _EagerBucket:
    """A plan's segments of one (Kind, step, lr scale) for the eager kernels, with their batches as columns."""

    def __init__(self, step: int, kind: Kind, scale: float, entries: List[Entry]):
        self.step, self.kind, self.scale, self.entries = step, kind, scale, entries
        self.batches = [([e.source for e in batch], tuple(zip(*(e.tensors for e in batch))))
                        for batch in _batched(entries, p_of=lambda e: e.tensors.p)]


class _Plan:
    """A group's step as made by :func:`make_plan`: reused while the gradients (presence, dtype, contiguity),
    the tensors' storage, their state (the dict, its tensors and steps) stay what they were (``holds``);
    the optimizer drops its plans when an anchor, F, lr scale or state is set."""

    def __init__(self, key, sig, ptrs, used, states, compiled, eager, cacheable):
        self.key, self.sig, self.ptrs, self.used, self.states = key, sig, ptrs, used, states
        self.compiled, self.eager, self.cacheable = compiled, eager, cacheable
        # each state's tensors in _LAYOUT_STATE's order, held (compared by identity: map keeps the loops in C)
        self._each = [st for st in states for _ in _LAYOUT_STATE]
        self._names = list(_LAYOUT_STATE) * len(states)
        self.held = list(map(dict.get, self._each, self._names))
        self.steps = [st["step"] for st in states]
        self.advanced = 0  # steps taken since it was made

    def holds(self, group: dict, grads: list, fused: bool, state: dict) -> bool:
        try:
            sig = _grad_signature(grads)
        except RuntimeError:  # e.g. a sparse layout's query: the slow path says what is wrong
            return False
        return (self.key == (fused, group["anneal_w"] > 0, _fused.MIN_SEGMENT, CHUNK) and sig == self.sig
                and list(map(Tensor.data_ptr, group["params"])) == self.ptrs
                and all(map(operator.is_, map(state.get, self.used), self.states))
                and all(map(operator.is_, map(dict.get, self._each, self._names), self.held))
                and list(map(_STEP, self.states)) == self.steps)

    def advance(self) -> None:
        for st in self.states:
            st["step"] += 1
        self.steps = [t + 1 for t in self.steps]
        self.advanced += 1


def make_plan(group: dict, grads: list, fused: bool, state: dict, layouts: Dict[int, _CachedLayout],
              lr_scales: dict) -> _Plan:
    """This step's segments of the group's tensors with a gradient, grouped by what they share: the
    compiled kernels' buckets (large contiguous segments, whole, each with its lr scale), then the eager
    ones (per Kind and lr scale, in pieces of at most CHUNK elements unless a tensor is taken whole).
    The gradients are named by (tensor index, element span), so the plan serves later steps while it
    holds; the rest of each tensor's segments comes from ``_layout``'s cache. Advances the steps.
    ``grads``: the group's gradients (a non-contiguous one is replaced by a contiguous copy); ``state``,
    ``layouts``, ``lr_scales``: the optimizer's state, layout cache (id(p) -> _CachedLayout) and lr scales."""
    compiled, eager = defaultdict(list), defaultdict(list)
    pulled, cacheable, used = group["anneal_w"] > 0, True, []
    sig = _grad_signature(grads)
    for i, (p, g) in enumerate(zip(group["params"], grads)):
        if g is None:
            continue
        if g.is_sparse:
            raise RuntimeError("RecAdam does not support sparse gradients")
        if not g.is_contiguous():
            g = grads[i] = g.contiguous()
            cacheable = False  # a copy each step: not a plan's gradient
        step, layout = _layout(layouts, p, g, fused, pulled, state[p], lr_scales.get(p))
        used.append(p)
        for seg in layout:
            if seg.route is _WHOLE:
                eager[step, seg.kind, seg.scale].append(Entry(Source(i, None), seg.scale, seg.tensors))
            elif seg.route is _COMPILED:
                span = _FLAT if seg.lo == 0 and seg.hi == p.numel() else (seg.lo, seg.hi)
                compiled[step, seg.kind].append(Entry(Source(i, span), seg.scale, seg.tensors))
            else:  # _CHUNKS
                eager[step, seg.kind, seg.scale].extend(Entry(Source(i, (c.lo, c.hi)), seg.scale, c.tensors)
                                                        for c in seg.chunks)
    states = [state[p] for p in used]
    key = (fused, pulled, _fused.MIN_SEGMENT, CHUNK)
    return _Plan(key, sig, [p.data_ptr() for p in group["params"]], used, states,
                 [_CompiledBucket(step, kind, entries) for (step, kind), entries in compiled.items()],
                 [_EagerBucket(step, kind, scale, entries) for (step, kind, scale), entries in eager.items()],
                 cacheable)


def _layout(cache: Dict[int, _CachedLayout], p: Tensor, g: Tensor, fused: bool, pulled: bool, state: dict,
            scale) -> Tuple[int, List[Routed]]:
    """(t, p's segments without the gradient), p's state (``state``) advanced to this step. Cached in ``cache``
    while p's storage, its state's tensors, its lr scale (``scale``), the gradient's dtype and the routing
    thresholds stay the same: a per-tensor layout has ~200 tensors, and remaking their views each step cost
    more host time than a GPU spends on the update."""
    key = (p.data_ptr(), g.dtype, fused, pulled, _fused.MIN_SEGMENT, CHUNK)
    cached = cache.get(id(p))
    if (cached is not None and cached.key == key and cached.scale == scale
            and all(map(operator.is_, map(state.get, _LAYOUT_STATE), cached.held))):
        state["step"] += 1
        return state["step"], cached.segments
    _advance(p, state)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    contiguous = all(x.is_contiguous() for x in (p, m, v))
    layout = []
    for lo, hi, a, f, c in _pieces(p, state, scale):
        anchored = a is not None and pulled
        f = f if anchored else None
        kind = Kind(anchored, (p.dtype, g.dtype, None if a is None else a.dtype, None if f is None else f.dtype),
                    p.device)
        if fused and contiguous and hi - lo >= _fused.MIN_SEGMENT:  # one kernel, no chunks
            # detached: dynamo refuses no-grad views of a leaf that requires grad
            seg = _segment(p.detach(), None, m, v, a, lo, hi, f)
            layout.append(Routed(_COMPILED, lo, hi, kind, c, _without_grad(seg)))
        elif not contiguous or (lo == 0 and hi == p.numel() <= CHUNK):  # the tensors themselves
            layout.append(Routed(_WHOLE, lo, hi, kind, c, Stored(p, m, v, a, f)))
        else:
            chunks = _chunked(_segment(p, None, m, v, a, lo, hi, f))
            layout.append(Routed(_CHUNKS, lo, hi, kind, c, None, tuple(
                Chunk(b, b + ch.p.numel(), _without_grad(ch)) for b, ch in zip(range(lo, hi, CHUNK), chunks))))
    cache[id(p)] = _CachedLayout(key, scale, tuple(map(state.get, _LAYOUT_STATE)), layout)
    return state["step"], layout


def _advance(p: Tensor, state: dict) -> dict:
    """p's state for this step: made at its first, on p's device, its step counted."""
    if "step" not in state:
        state["step"] = 0
        work = torch.float32 if p.dtype in _fused.HALF else p.dtype
        state["exp_avg"] = torch.zeros_like(p, dtype=work, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=work, memory_format=torch.preserve_format)
    for n in _STATE_TENSORS:  # e.g. left on CPU by fairseq's memory-efficient fp16 loading
        if n in state and state[n].device != p.device:
            state[n] = state[n].to(p.device)
    state["step"] += 1
    return state


def _anchor_pieces(p: Tensor, state: dict):
    """(start, end, anchor or None, F or None) over p's flattened elements: anchored runs and the gaps."""
    anchor, f = state.get("anchor"), state.get("fisher")
    if anchor is None:
        yield 0, p.numel(), None, None
    elif "anchor_runs" not in state:  # p's shape
        yield 0, p.numel(), anchor, f
    else:
        pos = off = 0
        for s, n in state["anchor_runs"]:
            if s > pos:
                yield pos, s, None, None
            yield s, s + n, anchor[off:off + n], None if f is None else f[off:off + n]
            pos, off = s + n, off + n
        if pos < p.numel():
            yield pos, p.numel(), None, None


def _pieces(p: Tensor, state: dict, scale):
    """(start, end, anchor or None, F or None, lr scale) over p's flattened elements: the anchor's pieces,
    split where the lr scale changes (``scale``: None, a number, or runs [(start, end, scale)] covering p)."""
    if not isinstance(scale, list):
        scale = 1.0 if scale is None else scale
        for lo, hi, a, f in _anchor_pieces(p, state):
            yield lo, hi, a, f, scale
        return
    runs, i = scale, 0
    for lo, hi, a, f in _anchor_pieces(p, state):
        flat = None if a is None else a.view(-1)
        fflat = None if f is None else f.view(-1)
        pos = lo
        while pos < hi:
            while runs[i][1] <= pos:
                i += 1
            end = min(hi, runs[i][1])
            yield (pos, end, None if a is None else flat[pos - lo:end - lo],
                   None if f is None else fflat[pos - lo:end - lo], runs[i][2])
            pos = end


def _segment(p: Tensor, g: Tensor, m: Tensor, v: Tensor, a: Optional[Tensor], lo: int, hi: int,
             f: Optional[Tensor] = None) -> Segment:
    """Elements [lo, hi) of a contiguous tensor as flat views (``a``, ``f``: already those elements' anchor, F)."""
    return Segment(_views(p, lo, hi), _views(g, lo, hi), _views(m, lo, hi), _views(v, lo, hi),
                   None if a is None else a.view(-1), None if f is None else f.reshape(-1))


def _chunked(seg: Segment) -> List[Segment]:
    """A flat segment as CHUNK-sized segments."""
    n = seg.p.numel()
    return [Segment(*(None if x is None else x[lo:lo + CHUNK] for x in seg)) for lo in range(0, n, CHUNK)]


def _batched(segs, p_of=operator.attrgetter("p")):
    """Consecutive segments in batches of at most CHUNK elements (a larger one alone); ``p_of``: a segment's p."""
    batch, size = [], 0
    for seg in segs:
        if batch and size + p_of(seg).numel() > CHUNK:
            yield batch
            batch, size = [], 0
        batch.append(seg)
        size += p_of(seg).numel()
    if batch:
        yield batch
