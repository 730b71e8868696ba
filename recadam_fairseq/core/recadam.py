"""RecAdam: Adam with a λ(t)-scaled step and a decoupled pull toward pretrained weights.

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
"""

import math
import operator
import warnings
from collections import defaultdict
from itertools import chain
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.optim import Optimizer

from . import fused as _fused
from .anneal import ANNEAL_FUNS, anneal_lambda
from .errors import ConfigError

__all__ = ["RecAdam"]

# Elements per batch of work. Bounds every temporary (the Adam denominator, fp32 copies of
# half-precision tensors) to a few buffers of this size instead of the model's size.
CHUNK = 1 << 21
# State tensors whose dtype we keep on load (torch would cast them to the parameter dtype).
_STATE_TENSORS = ("exp_avg", "exp_avg_sq", "anchor", "fisher")


def validate_hparams(h: dict, where: str = "", names: Optional[dict] = None) -> None:
    """Raise ValueError naming the first hyperparameter of ``h`` that is out of range.

    ``names`` maps a key to the (flag, config key) users know it by.
    """

    def _check(ok, key, value, rule, where):
        if not ok:
            shown = f"{key}={value!r}"
            if names and key in names:
                shown = f"{names[key][0]}={value!r} ({names[key][1]})"
            raise ConfigError(f"RecAdam: invalid {shown}{where}: {rule}")

    _check(h["lr"] >= 0, "lr", h["lr"], "must be >= 0", where)
    _check(h["eps"] >= 0, "eps", h["eps"], "must be >= 0", where)
    _check(h["weight_decay"] >= 0, "weight_decay", h["weight_decay"], "must be >= 0", where)
    betas = h["betas"]
    _check(
        len(tuple(betas)) == 2 and all(0.0 <= b < 1.0 for b in betas),
        "betas", tuple(betas), "each beta must be in [0, 1)", where,
    )
    _check(h["anneal_fun"] in ANNEAL_FUNS, "anneal_fun", h["anneal_fun"],
           f"choose one of {', '.join(ANNEAL_FUNS)}", where)
    _check(math.isfinite(h["anneal_k"]) and h["anneal_k"] >= 0, "anneal_k", h["anneal_k"],
           "must be finite and >= 0", where)
    _check(math.isfinite(h["anneal_t0"]), "anneal_t0", h["anneal_t0"], "must be finite", where)
    if h["anneal_fun"] == "linear":
        _check(h["anneal_t0"] > 0, "anneal_t0", h["anneal_t0"],
               "must be > 0 for the linear schedule", where)
    _check(math.isfinite(h["anneal_w"]) and h["anneal_w"] >= 0, "anneal_w", h["anneal_w"],
           "must be finite and >= 0", where)
    _check(math.isfinite(h["pretrain_cof"]) and h["pretrain_cof"] >= 0, "pretrain_cof",
           h["pretrain_cof"], "must be finite and >= 0", where)


def _views(x: Optional[Tensor], lo: int, hi: int) -> Optional[Tensor]:
    return None if x is None else x.view(-1)[lo:hi]


_COMPILED, _WHOLE, _CHUNKS = "compiled", "whole", "chunks"  # the routes of _layout's segments
_LAYOUT_STATE = ("exp_avg", "exp_avg_sq", "anchor", "fisher", "anchor_runs")  # what a layout is made of


def _without_grad(seg: "Segment") -> tuple:
    return seg.p, seg.exp_avg, seg.exp_avg_sq, seg.anchor, seg.fisher


class Segment(NamedTuple):
    """Elements of one tensor as an update call takes them: the tensors themselves or flat views."""
    p: Tensor
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    anchor: Optional[Tensor]  # p* of these elements; None: plain Adam
    fisher: Optional[Tensor] = None  # EWC's F of these elements (laid out as the anchor); None: F ≡ 1


class Kind(NamedTuple):
    """What segments share to be updated by one call, apart from their lr scale."""
    step: int  # t, of the tensor the segment belongs to
    anchored: bool  # pulled toward p* (an anchor, and anneal_w > 0)
    dtypes: Tuple[torch.dtype, ...]  # of p, grad, anchor and F (None: none)
    device: torch.device


_STEP = operator.itemgetter("step")
_FLAT = "flat"  # a plan's gradient span: the whole tensor, flattened


def _grad_signature(grads: list) -> list:
    """What a plan fixes of the gradients: which tensors have one, its dtype; False: not contiguous (or sparse)."""
    return [None if g is None else g.is_contiguous() and g.dtype for g in grads]


def _grads(grads: list, srcs: list) -> list:
    """The gradient views a plan's (tensor index, span) name: the tensor itself, flattened, or elements [lo, hi)."""
    return [grads[i] if span is None else grads[i].view(-1) if span is _FLAT else grads[i].view(-1)[span[0]:span[1]]
            for i, span in srcs]


def _materialize(entry: tuple, grads: list) -> Segment:
    i, span, p, m, v, a, f = entry
    return Segment(p, _grads(grads, [(i, span)])[0], m, v, a, f)


class _CompiledBucket:
    """A plan's segments of one Kind for the compiled kernels: columns, the gradients named by source."""

    def __init__(self, step: int, kind: tuple, entries: list):
        self.step, self.kind = step, kind
        self.srcs = [(i, span) for i, span, *_ in entries]
        self.scales = [e[2] for e in entries]
        self.unique_scales = list(dict.fromkeys(self.scales))
        self.ps, self.ms, self.vs, self.anchors, self.fishers = ([e[k] for e in entries] for k in (3, 4, 5, 6, 7))
        self.separate = len({p.untyped_storage().data_ptr() for p in self.ps}) == len(self.ps)
        self.programs = {}  # (anchors dropped, scalars' dim) -> fused.many_key of the program


class _EagerBucket:
    """A plan's segments of one (Kind, lr scale) for the eager kernels, with their batches as columns."""

    def __init__(self, step: int, kind: tuple, scale: float, entries: list):
        self.step, self.kind, self.scale, self.entries = step, kind, scale, entries
        self.batches = [([e[:2] for e in batch], tuple(zip(*(e[2:] for e in batch))))
                        for batch in _batched(entries, at=2)]


class _Plan:
    """A group's step as made by ``RecAdam._plan``: reused while the gradients (presence, dtype, contiguity),
    the tensors' storage, their state (the dict, its tensors and steps) stay what they were (``holds``);
    the optimizer drops its plans when an anchor, F, lr scale or state is set. At RoBERTa-base's ~200
    tensors, remaking it each step cost more host time than a GPU spends on the update."""

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


class RecAdam(Optimizer):
    r"""RecAdam ("Recall and Learn", Chen et al., EMNLP 2020).

    Drop-in for the authors' class: same arguments and defaults; a param group may carry its own
    ``pretrain_params`` (aligned with its ``params``), ``anneal_w``, ``lr``, ``weight_decay``...

    Args:
        params: tensors or param groups.
        lr, betas, eps, weight_decay, correct_bias: as in the authors' AdamW-style Adam
            (decoupled weight decay applied last; ε added to √v before bias correction).
        anneal_fun, anneal_k, anneal_t0, anneal_w: the λ(t) schedule (see :func:`anneal_lambda`).
        pretrain_cof: γ, the coefficient of the quadratic penalty.
        pretrain_params: pretrained tensors p* aligned with ``params`` (shapes must match).
            Required for groups with ``anneal_w > 0`` unless ``defer_anchors``.
        foreach: use multi-tensor ``torch._foreach_*`` kernels (default) or a per-tensor loop.
        fused: update each large contiguous segment in one pass with a ``torch.compile``d
            kernel (see ``fused.py``). None (default): when a group holds at least
            ``fused.AUTO_MIN_NUMEL`` elements and compiling works here, else the eager path
            (also after a failed compile, with a warning). True: always, and a failed compile
            raises. False: never. Not part of the saved state.
        cuda_graph: on CUDA, replay a per-tensor layout's one compiled program as a CUDA graph while its
            tensors keep their addresses (see ``fused.py``; opt-in: on an H100 at RoBERTa-base's shapes the
            step took 1.08x torch's fused AdamW against 1.82x without, pass 4). Not part of the saved state.
        defer_anchors: allow groups without ``pretrain_params``; anchors are attached later
            with :meth:`set_anchor`, and tensors without one get plain Adam.
    """

    supports_flat_params = True  # fairseq: may be built on one flat fp32 tensor
    supports_memory_efficient_fp16 = True  # fairseq: half params are updated in fp32 here

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        anneal_fun: str = "sigmoid",
        anneal_k: float = 0,
        anneal_t0: float = 0,
        anneal_w: float = 1.0,
        pretrain_cof: float = 5000.0,
        pretrain_params: Optional[Iterable[Tensor]] = None,
        *,
        foreach: Optional[bool] = None,
        fused: Optional[bool] = None,
        defer_anchors: bool = False,
        cuda_graph: bool = False,
    ):
        if fused and foreach is False:
            raise ValueError("RecAdam: fused=True and foreach=False cannot be combined")
        self.fused = fused
        self.cuda_graph = cuda_graph
        self._fused_failed = False
        self._many_keys = set()  # the multi-tensor programs this optimizer uses (fused.update_many)
        self._lr_scales = {}  # p -> its lr scale, a number or element runs (set_lr_scale); not saved state
        self._layouts = {}  # id(p) -> (key, what it was made from, its segments): _layout's cache, not saved
        self._plans = {}  # group index -> _Plan: a whole group's step, reused while it holds (_plan_holds)
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            correct_bias=correct_bias, anneal_fun=anneal_fun, anneal_k=anneal_k,
            anneal_t0=anneal_t0, anneal_w=anneal_w, pretrain_cof=pretrain_cof, foreach=foreach,
        )
        self._default_pretrain = pretrain_params
        self._defer_anchors = defer_anchors
        super().__init__(params, defaults)
        del self._default_pretrain  # only meaningful while the constructor adds groups

    # ----------------------------------------------------------------- groups and anchors
    def add_param_group(self, param_group: dict) -> None:
        param_group = dict(param_group)
        if "pretrain_params" in param_group:
            pretrain = param_group.pop("pretrain_params")
        else:
            pretrain = getattr(self, "_default_pretrain", None)
        index = len(self.param_groups)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group["betas"] = tuple(group["betas"])
        where = f" (param group {index})"
        validate_hparams(group, where)
        params = group["params"]
        if pretrain is None:
            if group["anneal_w"] > 0 and not self._defer_anchors:
                raise ValueError(
                    f"RecAdam: pretrain_params is required{where} when anneal_w > 0 "
                    f"(anneal_w={group['anneal_w']}); use anneal_w=0 for plain Adam"
                )
            return
        pretrain = list(pretrain)
        if len(pretrain) != len(params):
            raise ValueError(
                f"RecAdam: pretrain_params has {len(pretrain)} tensors but params has "
                f"{len(params)}{where}: they must be aligned one to one"
            )
        for i, (p, a) in enumerate(zip(params, pretrain)):
            if a is not None and tuple(a.shape) != tuple(p.shape):
                raise ValueError(
                    f"RecAdam: pretrain_params[{i}] has shape {tuple(a.shape)} but params[{i}] "
                    f"has shape {tuple(p.shape)}{where}"
                )
            self.set_anchor(p, a)

    def set_anchor(self, p: Tensor, anchor: Optional[Tensor],
                   runs: Optional[Sequence[Tuple[int, int]]] = None) -> None:
        """Attach (or with ``anchor=None`` remove) the pretrained value p* of parameter ``p``.

        Without ``runs`` the anchor has p's shape. With ``runs`` = [(start, length), ...] over
        p's flattened elements (sorted, disjoint), the anchor is a 1-D buffer holding those
        runs back to back; elements outside the runs get plain Adam. The anchor is used as
        given (no copy) unless it lives on another device; it may have a lower precision.
        """
        self._layouts.pop(id(p), None)  # its cached views would keep the old anchor alive until the next step
        self._plans.clear()
        state = self.state[p]
        state.pop("anchor", None)
        state.pop("anchor_runs", None)
        if anchor is None:
            state.pop("fisher", None)  # F weighs the anchor's elements: nothing left to weigh
            return
        anchor = anchor.detach()
        if anchor.numel() and anchor.device == p.device and anchor.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
            raise ValueError(
                "RecAdam: a pretrained tensor shares memory with its parameter, so it would move with it: "
                "pass a copy (p.detach().clone())"
            )
        if runs is None:
            if tuple(anchor.shape) != tuple(p.shape):
                raise ValueError(
                    f"RecAdam: anchor shape {tuple(anchor.shape)} != parameter shape {tuple(p.shape)}"
                )
        else:
            runs = [[int(s), int(n)] for s, n in runs]
            end = 0
            for s, n in runs:
                if s < end or n <= 0:
                    raise ValueError(f"RecAdam: anchor runs must be sorted, disjoint and non-empty: {runs}")
                end = s + n
            if end > p.numel() or anchor.numel() != sum(n for _, n in runs):
                raise ValueError(
                    f"RecAdam: anchor of {anchor.numel()} elements does not fit runs covering "
                    f"{sum(n for _, n in runs)} of {p.numel()} elements"
                )
            if not p.is_contiguous():
                raise ValueError("RecAdam: anchor runs need a contiguous parameter")
            anchor = anchor.reshape(-1)
            state["anchor_runs"] = runs
        if not anchor.is_floating_point():
            raise ValueError(f"RecAdam: anchor must be floating point, got {anchor.dtype}")
        state["anchor"] = anchor.to(device=p.device).contiguous()
        f = state.get("fisher")
        if f is not None and f.numel() != state["anchor"].numel():
            state.pop("fisher")  # another anchor layout: the old F does not fit it

    def set_fisher(self, p: Tensor, fisher: Optional[Tensor]) -> None:
        """Attach (or with None remove) EWC's per-element F of ``p``'s anchored elements.

        F has the anchor's layout (p's shape, or the anchor runs back to back), is finite and >= 0;
        it may have a lower precision (the update reads it in fp32). Needs an anchor (:meth:`set_anchor`).
        """
        self._layouts.pop(id(p), None)
        self._plans.clear()
        state = self.state[p]
        if fisher is None:
            state.pop("fisher", None)
            return
        anchor = state.get("anchor")
        if anchor is None:
            raise ValueError("RecAdam: set_fisher needs an anchor: F weighs the pull toward p*")
        fisher = fisher.detach()
        if fisher.numel() != anchor.numel() or (anchor.dim() > 1 and tuple(fisher.shape) != tuple(anchor.shape)):
            raise ValueError(f"RecAdam: F of shape {tuple(fisher.shape)} does not fit the anchor's "
                             f"{tuple(anchor.shape)}")
        if not fisher.is_floating_point():
            raise ValueError(f"RecAdam: F must be floating point, got {fisher.dtype}")
        fisher = fisher.to(device=p.device).reshape(anchor.shape).contiguous()
        if not bool(torch.isfinite(fisher).all()) or bool((fisher < 0).any()):
            raise ValueError("RecAdam: F must be finite and >= 0")
        state["fisher"] = fisher

    def fisher_of(self, p: Tensor) -> Optional[Tensor]:
        return self.state[p].get("fisher") if p in self.state else None

    def set_lr_scale(self, p: Tensor, scale: Union[None, float, Sequence[Tuple[int, int, float]]]) -> None:
        """Scale the learning rate of ``p`` (its Adam step, pull and decay) by ``scale``.

        ``scale`` is a number, or runs [(start, length, scale), ...] over p's flattened elements
        (sorted, disjoint; elements outside them keep lr); None or 1 removes the scale. Not part
        of the saved state: whoever sets it sets it again after a restart.
        """
        self._lr_scales.pop(p, None)
        self._plans.clear()  # (the layouts compare the scale itself)
        if scale is None:
            return
        if not isinstance(scale, (list, tuple)):
            scale = [(0, p.numel(), scale)]
        cover, end = [], 0  # runs of the whole tensor, gaps at 1, neighbours of one scale merged
        for s, n, c in scale:
            s, n, c = int(s), int(n), float(c)
            if s < end or n <= 0 or s + n > p.numel():
                raise ValueError(f"RecAdam: lr scale runs must be sorted, disjoint, non-empty and within the "
                                 f"tensor's {p.numel()} elements: {list(scale)}")
            if not (math.isfinite(c) and c > 0):
                raise ValueError(f"RecAdam: an lr scale must be finite and > 0, got {c}")
            cover += [(end, s, 1.0)] if s > end else []
            cover.append((s, s + n, c))
            end = s + n
        cover += [(end, p.numel(), 1.0)] if end < p.numel() else []
        merged = []
        for lo, hi, c in cover:
            if merged and merged[-1][2] == c:
                merged[-1] = (merged[-1][0], hi, c)
            else:
                merged.append((lo, hi, c))
        if len(merged) == 1:
            if merged[0][2] != 1.0:
                self._lr_scales[p] = merged[0][2]
            return
        if not p.is_contiguous():
            raise ValueError("RecAdam: lr scale runs need a contiguous parameter")
        self._lr_scales[p] = merged

    def lr_scale_of(self, p: Tensor):
        """p's lr scale: None (1), a number, or runs [(start, end, scale)] covering the whole tensor."""
        return self._lr_scales.get(p)

    def anchor_of(self, p: Tensor) -> Optional[Tensor]:
        return self.state[p].get("anchor") if p in self.state else None

    # ----------------------------------------------------------------- state dict
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict, keeping the moments and anchors in their saved dtype.

        (torch would cast them to the parameter dtype: the fp32 moments of fp16 parameters and a
        half-precision anchor of fp32 parameters would change.) Moments whose shape does not
        match the parameter raise ValueError: the state comes from another model.
        """
        self._layouts.clear()  # views of the old state's tensors
        self._plans.clear()
        state_dict = dict(state_dict)
        kept, rest = {}, {}
        for k, s in state_dict["state"].items():
            kept[k] = {n: v for n, v in s.items() if n in _STATE_TENSORS and torch.is_tensor(v)}
            rest[k] = {n: v for n, v in s.items() if n not in kept[k]}
        state_dict["state"] = rest
        super().load_state_dict(state_dict)
        params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        for k, tensors in kept.items():
            p = params[int(k)]
            for n, v in tensors.items():
                if n not in ("anchor", "fisher") and tuple(v.shape) != tuple(p.shape):
                    raise ValueError(
                        f"RecAdam: saved {n} of parameter {k} has shape {tuple(v.shape)} but the "
                        f"parameter has shape {tuple(p.shape)}: the state comes from another model"
                    )
            st = self.state[p]
            for n, v in tensors.items():
                st[n] = v.to(device=p.device)
            if "anchor" in st:
                runs, f = st.get("anchor_runs"), st.get("fisher")
                self.set_anchor(p, st["anchor"], runs)
                if f is not None:
                    self.set_fisher(p, f)

    # ----------------------------------------------------------------- what a run reports
    def anchored_step(self) -> int:
        """The step t of the anchored tensors (0 before their first update)."""
        for p, state in self._anchored():
            if "step" in state:
                return state["step"]
        return 0

    def current_lambda(self) -> float:
        """λ(t) of the first group holding anchored tensors, at their current step."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p, {})
                if "anchor" in state and "step" in state:
                    return anneal_lambda(group["anneal_fun"], state["step"], group["anneal_k"],
                                         group["anneal_t0"], group["anneal_w"])
        return 0.0

    @torch.no_grad()
    def anchor_distance(self) -> Tensor:
        """Σ(θ−θ*)² over the anchored elements, in float64, without a model-sized temporary.

        A few large segments (the flat layouts) take one compiled pass each (float64 accumulation);
        many (a per-tensor layout: ~200 tensors, where a call each cost 14 ms of host time on an H100)
        go in batches of at most DISTANCE_BATCH elements through ``_foreach_sub`` (fp32 differences) and
        ``_foreach_norm`` (float64 accumulation), squared and summed in float64.
        """
        compiled, batched, loose = [], [], []
        for group in self.param_groups:
            fused = self._fused_here(group)
            for p in group["params"]:
                state = self.state.get(p)
                if not state or "anchor" not in state:
                    continue
                for lo, hi, a, _ in _anchor_pieces(p, state):
                    if a is None:
                        continue
                    if not p.is_contiguous():
                        loose.append((p.detach(), a))
                    elif fused and hi - lo >= _fused.MIN_SEGMENT:
                        compiled.append((_views(p.detach(), lo, hi), a.view(-1)))
                    else:
                        batched.append((_views(p.detach(), lo, hi), a.view(-1)))
        if len(compiled) >= _fused.MULTI_MIN_SEGMENTS:
            compiled, batched = [], compiled + batched
        parts = []
        for x, a in compiled:
            part = self._fused_distance(x, a)
            if part is None:
                batched.append((x, a))
            else:
                parts.append(part)
        parts += _batched_distances(batched)
        for x, a in loose:
            d = (x.float() - a.float()).reshape(-1)
            parts.append(torch.dot(d, d).double())
        if not parts:
            return torch.zeros((), dtype=torch.float64)
        return torch.stack([t.to(parts[0].device) for t in parts]).sum()

    def _fused_distance(self, x: Tensor, a: Tensor) -> Optional[Tensor]:
        try:
            return _fused.distance(x, a)
        except Exception as e:  # noqa: BLE001 - a compiler missing or failing
            self._compile_failed(e, "distance")
            return None

    def _anchored(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "anchor" in state:
                    yield p, state

    # ----------------------------------------------------------------- the update
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, group in enumerate(self.param_groups):
            self._step_group(group, i)
        return loss

    def _step_group(self, group: dict, index: int) -> None:
        """(a) this step's plan: the group's cached one while it holds (``_Plan.holds``), else made anew;
        (b) run it: the compiled kernels, then the eager ones."""
        fused = self._fused_here(group)
        grads = [p.grad for p in group["params"]]
        plan = self._plans.get(index)
        if plan is not None and plan.holds(group, grads, fused, self.state):
            plan.advance()
        else:
            plan = self._plan(group, grads, fused)
            if plan.cacheable:
                self._plans[index] = plan
            else:
                self._plans.pop(index, None)
        self._run(group, plan, grads)

    # ----------------------------------------------------------------- (a) this step's segments, grouped
    def _plan(self, group: dict, grads: list, fused: bool) -> "_Plan":
        """This step's segments of the group's tensors with a gradient, grouped by what they share: the
        compiled kernels' buckets (large contiguous segments, whole, each with its lr scale), then the eager
        ones (per Kind and lr scale, in pieces of at most CHUNK elements unless a tensor is taken whole).
        The gradients are named by (tensor index, element span), so the plan serves later steps while it
        holds; the rest of each tensor's segments comes from ``_layout``'s cache. Advances the steps.
        ``grads``: the group's gradients (a non-contiguous one is replaced by a contiguous copy)."""
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
            step, layout = self._layout(p, g, fused, pulled)
            used.append(p)
            for route, lo, hi, kind, scale, (sp, sm, sv, sa, sf) in layout:
                if route is _WHOLE:
                    eager[step, kind, scale].append((i, None, sp, sm, sv, sa, sf))
                elif route is _COMPILED:
                    compiled[step, kind].append((i, _FLAT if lo == 0 and hi == p.numel() else (lo, hi), scale,
                                                 sp, sm, sv, sa, sf))
                else:  # _CHUNKS: sp holds [(start, end, (p, m, v, anchor, F) of the chunk)]
                    eager[step, kind, scale].extend((i, (a, b), cp, cm, cv, ca, cf)
                                                    for a, b, (cp, cm, cv, ca, cf) in sp)
        states = [self.state[p] for p in used]
        key = (fused, pulled, _fused.MIN_SEGMENT, CHUNK)
        return _Plan(key, sig, [p.data_ptr() for p in group["params"]], used, states,
                     [_CompiledBucket(step, kind, entries) for (step, kind), entries in compiled.items()],
                     [_EagerBucket(step, kind, scale, entries) for (step, kind, scale), entries in eager.items()],
                     cacheable)

    # ----------------------------------------------------------------- (b) running a plan
    def _run(self, group: dict, plan: "_Plan", grads: list) -> None:
        extra = defaultdict(list)  # (Kind, lr scale) -> [Segment]: what failed to compile, for the eager path
        for b in plan.compiled:
            self._run_compiled(group, Kind(b.step + plan.advanced, *b.kind), b, grads, extra)
        kernel = _foreach_update if group["foreach"] in (None, True) else _single_tensor_update
        for b in plan.eager:
            kind = Kind(b.step + plan.advanced, *b.kind)
            scalars = self._scalars(group, kind.step, kind.anchored, b.scale)
            more = extra.pop((kind, b.scale), None)
            if more is None:  # the batches as made with the plan
                for srcs, (ps, ms, vs, anchors, fishers) in b.batches:
                    kernel(ps, _grads(grads, srcs), ms, vs, anchors, fishers, **scalars)
            else:
                for batch in _batched([_materialize(e, grads) for e in b.entries] + more):
                    kernel(*zip(*batch), **scalars)
        for (kind, scale), segs in extra.items():
            scalars = self._scalars(group, kind.step, kind.anchored, scale)
            for batch in _batched(segs):
                kernel(*zip(*batch), **scalars)

    def _layout(self, p: Tensor, g: Tensor, fused: bool, pulled: bool):
        """(t, p's segments without the gradient): (route, start, end, Kind's fields but t, lr scale, the
        segment's (p, m, v, anchor, F)). Cached while p's storage, its state's tensors, its lr scale, the
        gradient's dtype and the routing thresholds stay the same: a per-tensor layout has ~200 tensors,
        and remaking their views each step cost more host time than a GPU spends on the update."""
        state = self.state[p]
        cached = self._layouts.get(id(p))
        if cached is not None:
            key, held, layout = cached
            if (key == (p.data_ptr(), g.dtype, fused, pulled, _fused.MIN_SEGMENT, CHUNK)
                    and held[0] == self._lr_scales.get(p) and state.get("exp_avg") is held[1]
                    and state.get("exp_avg_sq") is held[2] and state.get("anchor") is held[3]
                    and state.get("fisher") is held[4] and state.get("anchor_runs") is held[5]):
                state["step"] += 1
                return state["step"], layout
        state = self._advance(p)
        m, v, scale = state["exp_avg"], state["exp_avg_sq"], self._lr_scales.get(p)
        contiguous = all(x.is_contiguous() for x in (p, m, v))
        layout = []
        for lo, hi, a, f, c in _pieces(p, state, scale):
            anchored = a is not None and pulled
            f = f if anchored else None
            kind = (anchored, (p.dtype, g.dtype, None if a is None else a.dtype, None if f is None else f.dtype),
                    p.device)
            if fused and contiguous and hi - lo >= _fused.MIN_SEGMENT:  # one kernel, no chunks
                # detached: dynamo refuses no-grad views of a leaf that requires grad
                seg = _segment(p.detach(), None, m, v, a, lo, hi, f)
                layout.append((_COMPILED, lo, hi, kind, c, _without_grad(seg)))
            elif not contiguous or (lo == 0 and hi == p.numel() <= CHUNK):  # the tensors themselves
                layout.append((_WHOLE, lo, hi, kind, c, (p, m, v, a, f)))
            else:
                chunks = _chunked(_segment(p, None, m, v, a, lo, hi, f))
                spans = [(b, b + ch.p.numel(), _without_grad(ch)) for b, ch in zip(range(lo, hi, CHUNK), chunks)]
                layout.append((_CHUNKS, lo, hi, kind, c, (spans, None, None, None, None)))
        # what it was made from: the lr scale, and the state's tensors (held: compared by identity)
        held = (scale, *(state.get(n) for n in _LAYOUT_STATE))
        self._layouts[id(p)] = ((p.data_ptr(), g.dtype, fused, pulled, _fused.MIN_SEGMENT, CHUNK), held, layout)
        return state["step"], layout

    def _advance(self, p: Tensor) -> dict:
        """p's state for this step: made at its first, on p's device, its step counted."""
        state = self.state[p]
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

    # ----------------------------------------------------------------- (b) the compiled kernels
    def _run_compiled(self, group: dict, kind: Kind, b: "_CompiledBucket", grads: list, eager: dict) -> None:
        """Update bucket ``b`` (one Kind) with the compiled kernels: one program for separate tensors
        (``_one_program``), else one call per segment. What fails to compile goes to ``eager``."""
        table = {c: self._scalars(group, kind.step, kind.anchored, c) for c in b.unique_scales}
        drop = all(x["pull"] == 0.0 for x in table.values())  # no pull this step: neither θ* nor F is read
        none = [None] * len(b.ps)
        segs = list(zip(b.ps, _grads(grads, b.srcs), b.ms, b.vs, none if drop else b.anchors,
                        none if drop else b.fishers))
        dtype, s = b.ms[0].dtype, {}  # s: the scalars tensor of each lr scale, made when needed
        s_many = self._one_program(b, segs, drop, table, dtype, kind.device)
        for i, seg in enumerate([segs] if s_many is not None else segs):
            try:
                if s_many is not None:
                    _fused.update_many(seg, s_many, graph=self.cuda_graph or None)
                else:
                    c = b.scales[i]
                    if c not in s:
                        s[c] = _fused.scalars(**table[c], dtype=dtype, device=kind.device)
                    _fused.update_segments([seg], s[c])
            except Exception as e:  # noqa: BLE001 - a compiler missing or failing
                self._compile_failed(e, "update")
                for rest, c in zip(segs[i:], b.scales[i:]):
                    eager[kind, c] += _chunked(Segment(*rest))
                return

    def _one_program(self, b: "_CompiledBucket", segs: List[tuple], drop: bool, table: dict,
                     dtype: torch.dtype, device: torch.device) -> Optional[Tensor]:
        """The scalars of one compiled program updating all of ``segs``, or None: one call per segment.

        Only separate tensors (a per-tensor layout) take one program; each new set of them compiles a new
        one, so an optimizer keeps at most ``fused.MULTI_MAX_PROGRAMS`` (``_many_keys``). Several lr
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
        if program not in self._many_keys and len(self._many_keys) >= _fused.MULTI_MAX_PROGRAMS:
            return None
        self._many_keys.add(program)
        return s

    def _compile_failed(self, e: Exception, what: str) -> None:
        """The one fallback of the compiled kernels (``what``: update, distance): fused=True raises;
        otherwise a warning, and the eager path from now on (``_fused_here``)."""
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if self.fused:
            raise RuntimeError(f"RecAdam: fused=True, but the fused {what} failed to compile ({why}); use "
                               f"fused=None or False (--recadam-fused auto/off)") from e
        self._fused_failed = True
        warnings.warn(f"RecAdam: the fused {what} failed to compile ({why}); using the eager {what} from now "
                      f"on (fused=False / --recadam-fused off skips the attempt)")

    def _fused_here(self, group: dict) -> bool:
        """Whether this group's large segments take the fused kernel on this step."""
        if self.fused is False or self._fused_failed or not group["params"]:
            return False
        device = group["params"][0].device
        if self.fused:
            if not _fused.available(device):
                raise RuntimeError(f"RecAdam: fused=True needs torch.compile on {device.type}; "
                                   f"pass fused=None or False")
            return True
        return (group["foreach"] is not False and _fused.available(device)
                and sum(p.numel() for p in group["params"]) >= _fused.AUTO_MIN_NUMEL)

    @staticmethod
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


def _batched(segs, at: int = 0):
    """Consecutive segments in batches of at most CHUNK elements (a larger one alone); ``at``: where p is."""
    batch, size = [], 0
    for seg in segs:
        if batch and size + seg[at].numel() > CHUNK:
            yield batch
            batch, size = [], 0
        batch.append(seg)
        size += seg[at].numel()
    if batch:
        yield batch


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
