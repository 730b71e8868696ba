"""RecAdam: Adam with a λ(t)-scaled step and a decoupled pull toward pretrained weights.

Pure torch (no fairseq import). The optimizer: its hyperparameters, param groups, anchors p* (whole
tensors, or element runs of a flat tensor), EWC's F, lr scales, saved state, and what a run reports.
The update itself, line by line: ``recadam_kernels.py``; which elements each of its calls updates, cached
from step to step: ``recadam_plan.py``.
"""

import math
import warnings
from itertools import chain
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.optim import Optimizer

from . import fused as _fused
from .anneal import ANNEAL_FUNS, anneal_lambda
from .errors import ConfigError
from .recadam_kernels import _batched_distances, run_plan
from .recadam_plan import _STATE_TENSORS, _anchor_pieces, _Plan, _views, make_plan

__all__ = ["RecAdam"]


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
        self._layouts = {}  # id(p) -> recadam_plan._CachedLayout: its layout's cache, not saved state
        self._plans = {}  # group index -> _Plan: a whole group's step, reused while it holds (_Plan.holds)
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
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "anchor" in state and "step" in state:
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
        go in batches of at most ``recadam_kernels.DISTANCE_BATCH`` elements through ``_foreach_sub`` (fp32
        differences) and ``_foreach_norm`` (float64 accumulation), squared and summed in float64.
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
        run_plan(group, plan, grads, graph=self.cuda_graph or None, programs=self._many_keys,
                 failed=self._compile_failed)

    def _plan(self, group: dict, grads: list, fused: bool) -> _Plan:
        """This step's plan of ``group`` (``recadam_plan.make_plan``), made anew; advances the steps."""
        return make_plan(group, grads, fused, self.state, self._layouts, self._lr_scales)

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
