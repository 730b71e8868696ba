"""RecAdam's update: the math, its eager kernels, and the running of a step's plan.

Pure torch (no fairseq import). The update of one tensor at its own step t (the steps on which
it had a gradient), exactly in this order:

    m ← β1·m + (1−β1)·g ;  v ← β2·v + (1−β2)·g²
    s ← lr·√(1−β2^t)/(1−β1^t)            (s ← lr when correct_bias is False)
    anchored and anneal_w > 0:  λ ← anneal_lambda(fun, t, k, t0, w)
                                p ← p − s·λ·m/(√v+ε) ;  p ← p − lr·(w−λ)·γ·(p − p*)
                                (EWC, a Fisher F set: p ← p − min(lr·(w−λ)·γ·F, 1)·(p − p*))
    otherwise:                  p ← p − s·m/(√v+ε)
    weight_decay > 0:           p ← p − lr·weight_decay·p

With a learning-rate scale c on a tensor (or an element run of a flat tensor; layer-wise decay,
:meth:`RecAdam.set_lr_scale`), lr reads lr·c in every line above: the Adam step, the pull and the
decay follow the tensor's own lr, as decoupled weight decay does with per-group lrs.

A tensor is "anchored" when it has a pretrained value p* (``pretrain_params`` or
:meth:`RecAdam.set_anchor`). An anchor may cover the whole tensor, or only some element runs of
a flat tensor (fairseq's ``--fp16`` hands the optimizer one flat tensor holding every parameter):
elements outside the runs get plain Adam.

EWC (:meth:`RecAdam.set_fisher`): a per-element weight F ≥ 0 of the anchored elements, laid out as
the anchor. Each element's pull weight is capped at 1 (it lands on p*, the minimiser of its penalty,
and never overshoots it, whatever F's largest entries); with F ≡ 1 and lr·(w−λ)·γ ≤ 1 the update is
RecAdam's bit for bit. Segments with F take the same routes as those without (the compiled kernels
read F and cap the weight in their one pass; ``fused.py``).

Here: the step's scalars (:func:`_scalars`: the bias-corrected step size, λ, the pull and the decay), the
eager kernels applying the lines above to a batch of segments (:func:`_foreach_update`, and
:func:`_single_tensor_update`, its per-tensor reference), Σ(θ−θ*)² in batches (:func:`_batched_distances`),
and :func:`run_plan`, which sends a group's plan (``recadam_plan.py``: which elements each call updates)
to the compiled kernels (``fused.py``) and then to the eager ones.
"""

import math
from collections import defaultdict
from typing import Callable, List, Optional

import torch
from torch import Tensor

from . import fused as _fused
from .anneal import anneal_lambda
from .recadam_plan import CHUNK, Segment, _batched, _chunked, _CompiledBucket, _grads, _materialize, _Plan


def _scalars(group: dict, t: int, anchored: bool, scale: float = 1.0) -> dict:
    """adam_scale, pull, decay and the betas of tensors at step t with lr scale ``scale`` (see the module
    docstring)."""
    beta1, beta2 = group["betas"]
    lr, w = group["lr"] * scale, group["anneal_w"]  # x 1.0 is exact: no scale, the same numbers
    step_size = lr
    if group["correct_bias"]:
        step_size = lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
    if anchored:
        lam = anneal_lambda(group["anneal_fun"], t, group["anneal_k"], group["anneal_t0"], w)
        adam_scale, pull = step_size * lam, lr * (w - lam) * group["pretrain_cof"]
    else:
        adam_scale, pull = step_size, 0.0
    return dict(beta1=beta1, beta2=beta2, eps=group["eps"], adam_scale=adam_scale, pull=pull,
                decay=lr * group["weight_decay"])


# ----------------------------------------------------------------- running a plan
def run_plan(group: dict, plan: _Plan, grads: list, *, graph: Optional[bool], programs: set,
             failed: Callable[[Exception, str], None]) -> None:
    """One step of ``group`` as ``plan`` lays it out: the compiled buckets, then the eager ones (with whatever
    failed to compile). ``graph``: fused.update_many's; ``programs``: the optimizer's multi-tensor programs
    (``_one_program``); ``failed(e, what)``: the optimizer's one fallback (it raises, or warns and falls back)."""
    extra = defaultdict(list)  # (t, Kind, lr scale) -> [Segment]: what failed to compile, for the eager path
    for b in plan.compiled:
        _run_compiled(group, b.step + plan.advanced, b, grads, extra, graph, programs, failed)
    kernel = _foreach_update if group["foreach"] in (None, True) else _single_tensor_update
    for b in plan.eager:
        step = b.step + plan.advanced
        scalars = _scalars(group, step, b.kind.anchored, b.scale)
        more = extra.pop((step, b.kind, b.scale), None)
        if more is None:  # the batches as made with the plan
            for srcs, (ps, ms, vs, anchors, fishers) in b.batches:
                kernel(ps, _grads(grads, srcs), ms, vs, anchors, fishers, **scalars)
        else:
            for batch in _batched([_materialize(e, grads) for e in b.entries] + more):
                kernel(*zip(*batch), **scalars)
    for (step, kind, scale), segs in extra.items():
        scalars = _scalars(group, step, kind.anchored, scale)
        for batch in _batched(segs):
            kernel(*zip(*batch), **scalars)


def _run_compiled(group: dict, step: int, b: _CompiledBucket, grads: list, eager: dict, graph: Optional[bool],
                  programs: set, failed: Callable[[Exception, str], None]) -> None:
    """Update bucket ``b`` (one Kind, at step ``step``) with the compiled kernels: one program for separate
    tensors (``_one_program``), else one call per segment. What fails to compile goes to ``eager``."""
    table = {c: _scalars(group, step, b.kind.anchored, c) for c in b.unique_scales}
    drop = all(x["pull"] == 0.0 for x in table.values())  # no pull this step: neither θ* nor F is read
    none = [None] * len(b.ps)
    segs = list(zip(b.ps, _grads(grads, b.srcs), b.ms, b.vs, none if drop else b.anchors,
                    none if drop else b.fishers))
    dtype, device, s = b.ms[0].dtype, b.kind.device, {}  # s: the scalars tensor of each lr scale, made when needed
    s_many = _one_program(b, segs, drop, table, dtype, device, programs)
    for i, seg in enumerate([segs] if s_many is not None else segs):
        try:
            if s_many is not None:
                _fused.update_many(seg, s_many, graph=graph)
            else:
                c = b.scales[i]
                if c not in s:
                    s[c] = _fused.scalars(**table[c], dtype=dtype, device=device)
                _fused.update_segments([seg], s[c])
        except Exception as e:  # noqa: BLE001 - a compiler missing or failing
            failed(e, "update")
            for rest, c in zip(segs[i:], b.scales[i:]):
                eager[step, b.kind, c] += _chunked(Segment(*rest))
            return


def _one_program(b: _CompiledBucket, segs: List[tuple], drop: bool, table: dict, dtype: torch.dtype,
                 device: torch.device, programs: set) -> Optional[Tensor]:
    """The scalars of one compiled program updating all of ``segs``, or None: one call per segment.

    Only separate tensors (a per-tensor layout) take one program; each new set of them compiles a new
    one, so an optimizer keeps at most ``fused.MULTI_MAX_PROGRAMS`` (``programs``). Several lr
    scales (layer-wise decay): one program still, with a row of scalars per tensor.
    """
    if len(segs) < _fused.MULTI_MIN_SEGMENTS or not b.separate:
        return None
    scales = b.scales
    rows = [table[c] for c in (scales[:1] if len(table) == 1 else scales)]
    s = (_fused.scalars(**rows[0], dtype=dtype, device=device) if len(rows) == 1
         else _fused.scalar_rows(rows, dtype, device))
    program = b.programs.get((drop, s.dim()))
    if program is None:  # (the bucket fixes the dtypes and sizes)
        program = b.programs[drop, s.dim()] = _fused.many_key(segs) + (s.dim(),)
    if program not in programs and len(programs) >= _fused.MULTI_MAX_PROGRAMS:
        return None
    programs.add(program)
    return s


# ----------------------------------------------------------------- the eager kernels
def _as_fp32(xs):
    return [x if x.dtype == torch.float32 else x.float() for x in xs]


def _fp32(xs):
    return [x.float() if x.dtype in _fused.HALF else x for x in xs]


def _pull_weights(fs, pull: float, dtype: torch.dtype):
    """EWC's per-element lerp weights min(pull·F, 1): capped at 1, an element lands on p* (the minimiser
    of its penalty) instead of overshooting it (oscillating for 1 < pull·F < 2, diverging beyond)."""
    return [torch.clamp(f.to(dtype) * pull, max=1.0) for f in fs]


def _foreach_update(ps, gs, ms, vs, anchors, fishers, *, beta1, beta2, eps, adam_scale, pull, decay):
    """One batch of segments with identical scalars, with multi-tensor kernels."""
    half_p = ps[0].dtype in _fused.HALF
    ps32, gs = (_fp32(ps) if half_p else list(ps)), _fp32(gs)
    ms, vs = list(ms), list(vs)
    torch._foreach_mul_(ms, beta1)
    torch._foreach_add_(ms, gs, alpha=1.0 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, gs, gs, value=1.0 - beta2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(ps32, ms, denom, value=-adam_scale)
    del denom
    if pull != 0.0:  # p ← p − pull·(p − p*), without a temporary: lerp toward p*
        anchors = list(anchors)
        if anchors[0].dtype != ps32[0].dtype:
            anchors = [a.to(ps32[0].dtype) for a in anchors]
        torch._foreach_lerp_(ps32, anchors, pull if fishers[0] is None else _pull_weights(fishers, pull, ps32[0].dtype))
    if decay != 0.0:
        torch._foreach_add_(ps32, ps32, alpha=-decay)
    if half_p:
        torch._foreach_copy_(list(ps), ps32)


def _single_tensor_update(ps, gs, ms, vs, anchors, fishers, *, beta1, beta2, eps, adam_scale, pull, decay):
    """The same batch, one tensor at a time (reference for the multi-tensor path)."""
    for p, g, m, v, a, f in zip(ps, gs, ms, vs, anchors, fishers):
        p32 = p.float() if p.dtype in _fused.HALF else p
        g = g.float() if g.dtype in _fused.HALF else g
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        p32.addcdiv_(m, v.sqrt().add_(eps), value=-adam_scale)
        if pull != 0.0:
            p32.lerp_(a.to(p32.dtype), pull if f is None else _pull_weights([f], pull, p32.dtype)[0])
        if decay != 0.0:
            p32.add_(p32, alpha=-decay)
        if p32 is not p:
            p.copy_(p32)


# ----------------------------------------------------------------- Σ(θ−θ*)², for anchor_distance
DISTANCE_BATCH = 8 * CHUNK  # elements of θ−θ* held at once by anchor_distance's batches (64 MB in fp32)


def _batched_distances(pairs) -> List[Tensor]:
    """Σ(x−a)² of (flat x, flat a) pairs in batches of at most DISTANCE_BATCH elements, one float64 sum each."""
    pieces = [(x[o:o + DISTANCE_BATCH], a[o:o + DISTANCE_BATCH]) for x, a in pairs
              for o in range(0, x.numel(), DISTANCE_BATCH)]
    out, batch, size = [], [], 0
    for x, a in pieces + [(None, None)]:
        if batch and (x is None or size + x.numel() > DISTANCE_BATCH):
            xs, as_ = zip(*batch)
            d = torch._foreach_sub(_as_fp32(xs), _as_fp32(as_))
            # norms accumulated in float64: fp32's was 2e-3 off at 22M elements on the CPU
            out.append(torch.stack(torch._foreach_norm(d, 2, dtype=torch.float64)).square().sum())
            batch, size = [], 0
        if x is not None:
            batch.append((x, a))
            size += x.numel()
    return out
