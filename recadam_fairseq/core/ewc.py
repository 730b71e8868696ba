"""EWC (Kirkpatrick et al., PNAS 2017): the pull toward θ* weighted per element by a diagonal Fisher F.

Pure torch (no fairseq import). RecAdam is EWC with F ≡ 1; here F is

- accumulated from per-example gradients g_i at θ* (:class:`FisherSum`: the empirical Fisher
  (1/N)·Σ_i g_i², with the examples' own labels; :class:`FisherPass`: a batch's g_i, a chunk of examples a
  vmap, ``core/per_example.py``),
- checked against the model (:func:`check`: names, shapes, finite, >= 0; one line each),
- normalised to mean 1 over the anchored elements (:func:`normalise`), so that γ
  (``--recadam-pretrain-cof``) keeps RecAdam's meaning: the average element is pulled as hard as
  RecAdam pulls every element,
- used by the optimizer (``RecAdam.set_fisher``: decoupled, each element's pull weight capped at 1)
  or in the loss (:func:`distance`: coupled, ½·γ·Σ F·(θ−θ*)², its gradient without a graph per tensor).

A Fisher file (``scripts/fisher.py``) is a ``torch.save``d dict {"fisher": {name: F}, "examples": N,
"source": text}; F is stored un-normalised (the mean of g²), as computed.
"""

import math
import os
from typing import Callable, Container, Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import checkpoint_file, per_example
from .errors import ConfigError

FLAG = "--ewc-fisher"
TASK = "task"  # --ewc-fisher task: the target task's empirical Fisher at θ*, before update 1


class FisherSum:
    """Σ_i g_i² over examples, in float64 when the parameters are float64, else fp32 (per-example gradients
    are small: their squares are summed in at least fp32)."""

    def __init__(self, params: Sequence[Tensor]):
        self.sums = [torch.zeros_like(p, dtype=torch.float64 if p.dtype == torch.float64 else torch.float32)
                     for p in params]
        self.examples = 0

    @torch.no_grad()
    def add(self, grads: Sequence[Optional[Tensor]], scale: float = 1.0) -> bool:
        """Add one example's gradients of its loss × ``scale`` (an fp16 loss scale, removed here).
        Nothing is added and False is returned when one is inf/NaN (the caller lowers the scale)."""
        gs = [None if g is None else g.to(s.dtype) / scale for g, s in zip(grads, self.sums)]
        live = [(g, s) for g, s in zip(gs, self.sums) if g is not None]
        if live and not bool(torch.stack([torch.isfinite(g).all() for g, _ in live]).all()):
            return False
        for g, s in live:
            s.addcmul_(g, g)
        self.examples += 1
        return True

    @torch.no_grad()
    def add_rows(self, grads: Sequence[Optional[Tensor]], scale: float = 1.0, check_finite: bool = True) -> int:
        """Add a chunk of examples' gradients (each [c, *shape], of the losses × ``scale``), a multi-tensor
        multiply-add per example (no chunk-sized temporary); returns c. ``check_finite``: the chunk's sums are
        taken apart and checked first (a model-sized buffer), and 0 is returned, nothing added, when one is
        inf/NaN (a half-precision overflow; in fp32 a NaN would stop at :func:`check`)."""
        live = [(g, s) for g, s in zip(grads, self.sums) if g is not None]
        if not live:
            return 0
        sums = [s for _, s in live]
        into = [torch.zeros_like(s) for s in sums] if check_finite else sums
        for i in range(live[0][0].size(0)):
            rows = [g[i] for g, _ in live]
            torch._foreach_addcmul_(into, rows, rows, value=1.0 / (scale * scale))  # a power of 2: exact
        if check_finite:
            if not bool(torch.stack([torch.isfinite(x).all() for x in into]).all()):
                return 0
            torch._foreach_add_(sums, into)
        self.examples += live[0][0].size(0)
        return live[0][0].size(0)

    def mean(self) -> list:
        return [s / max(self.examples, 1) for s in self.sums]


class FisherPass:
    """Σ_i g_i² over the examples of the batches given to :meth:`add`, g_i the gradient of example i's loss
    (``loss_fn(module, sample)``: one loss per example) w.r.t. the ``named`` parameters: ``chunk`` examples a vmap
    (``per_example.Vmapped``), or one at a time (``chunk`` 0, or a model vmap cannot take: ``why`` says why).
    ``scale``: the first loss scale (half precision), halved when a gradient overflows."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable, named: Sequence[Tuple[str, Tensor]], chunk: int,
                 pad: Optional[Callable] = None, scale: float = 1.0, traced: Optional[Callable] = None,
                 say: Callable[[str], None] = lambda why: None):
        self.module, self.loss_fn, self.names = module, loss_fn, [n for n, _ in named]
        self.params = [p for _, p in named]
        self.sums = FisherSum(self.params)
        self.scale = float(scale)
        self.half = self.scale != 1.0  # a half-precision model's pass: overflows are looked for
        self.vmapped = per_example.Vmapped(module, loss_fn, named, chunk, pad, traced=traced) if chunk else None
        self.why, self.say = ("" if chunk else "one at a time (batch size 0)"), say
        if not chunk:
            say(self.why)

    @property
    def examples(self) -> int:
        return self.sums.examples

    def _lower(self, what: str) -> None:
        if self.scale <= 1.0:
            raise FloatingPointError(f"{what} overflows even without a loss scale")
        self.scale /= 2

    def add(self, sample, n: int, tick: Callable[[int], None] = lambda done: None) -> None:
        """Add the ``n`` examples of ``sample``; ``tick(examples so far)`` after each chunk or example."""
        start = self.examples
        if self.vmapped is not None:
            it = self.vmapped.grads(sample, n, lambda: self.scale)
            try:
                grads = next(it, None)
                while grads is not None:
                    if self.sums.add_rows([grads[k] for k in self.names], self.scale, check_finite=self.half):
                        tick(self.examples)
                        grads = next(it, None)
                    else:
                        self._lower("an fp16 per-example gradient")
                        it.send(True)
                        grads = next(it)
                return
            except per_example.NotBatchable as e:  # the examples added so far stand; the rest one at a time
                self.vmapped, self.why = None, f"one at a time ({e})"
                self.say(self.why)
        done = self.examples - start
        rest = per_example.rows(sample, n, done, n) if done else sample
        it = per_example.one_at_a_time(self.module, self.loss_fn, self.params, rest, lambda: self.scale)
        for grads in it:
            while not self.sums.add(grads, self.scale):
                self._lower("an fp16 per-example gradient")
                it.send(True)
                grads = next(it)
            tick(self.examples)


def check(fisher: Dict[str, Tensor], shapes: Dict[str, tuple], anchored: Iterable[str], where: str) -> None:
    """ConfigError (one line, naming ``where``: the flag and file) when F does not fit the model: a name the
    model lacks, another shape, an anchored parameter without F, a non-finite or negative value."""
    for n, f in fisher.items():
        if n not in shapes:
            raise ConfigError(f"{where}: parameter {n} is not in the model (another model's Fisher?)")
        if not torch.is_tensor(f) or not f.is_floating_point():
            raise ConfigError(f"{where}: F of {n} is not a floating-point tensor")
        if tuple(f.shape) != tuple(shapes[n]):
            raise ConfigError(f"{where}: F of {n} has shape {tuple(f.shape)}, the model's parameter {tuple(shapes[n])}")
        if not bool(torch.isfinite(f).all()):
            raise ConfigError(f"{where}: F of {n} holds {int((~torch.isfinite(f)).sum())} NaN or Inf value(s)")
        if bool((f < 0).any()):
            raise ConfigError(f"{where}: F of {n} holds {int((f < 0).sum())} negative value(s): a Fisher is >= 0")
    missing = [n for n in anchored if n not in fisher]
    if missing:
        more = f", ... ({len(missing)} in all)" if len(missing) > 3 else ""
        raise ConfigError(f"{where}: no F for the pretrained parameter(s) {', '.join(missing[:3])}{more}")


def normalise(fisher: Dict[str, Tensor], names: Sequence[str], where: str,
              keep: Optional[Container[str]] = None) -> Tuple[Dict[str, Tensor], float]:
    """F / mean(F) over the elements of ``names`` (the anchored ones): mean F = 1 there, in fp32 (float64
    sum). Returns (the normalised F of ``names``, or of those also in ``keep`` (a rank's shard), the mean
    divided by). All zeros: ConfigError."""
    total = sum(float(fisher[n].double().sum()) for n in names)
    count = sum(fisher[n].numel() for n in names)
    mean = total / max(count, 1)
    if not (mean > 0 and math.isfinite(mean)):
        raise ConfigError(f"{where}: F is zero on every pretrained element (mean {mean:g}): nothing to weigh the "
                          f"pull with (no examples, or a loss without gradient?)")
    kept = names if keep is None else [n for n in names if n in keep]
    return {n: (fisher[n].double() / mean).float() for n in kept}, mean


def penalty(pairs: Sequence[Tuple[Tensor, Tensor, Optional[Tensor]]]) -> Tensor:
    """Σ F·(θ−θ*)² over (θ, θ*, F or None) in fp32 through autograd, F None is F ≡ 1: the reference of
    :func:`distance` (one graph node per tensor and operation)."""
    return sum(((p.float() - a.float()) ** 2 if f is None else f.float() * (p.float() - a.float()) ** 2).sum()
               for p, a, f in pairs)


class Pull:
    """θ* and F of the coupled objective's tensors θ (``pairs``: (θ, θ*, F or None), F None: F ≡ 1), for
    :func:`distance`, each in the dtype it is kept in. The arithmetic is in at least fp32 (θ's dtype if wider)."""

    def __init__(self, pairs: Sequence[Tuple[Tensor, Tensor, Optional[Tensor]]]):
        self.params = [p for p, _, _ in pairs]
        self.anchors = [a for _, a, _ in pairs]
        self.dtypes = [torch.promote_types(p.dtype, torch.float32) for p in self.params]
        weights = [f for _, _, f in pairs]
        self.fisher = None if all(f is None for f in weights) else [
            torch.ones_like(a, dtype=torch.float32) if f is None else f for f, a in zip(weights, self.anchors)]


class _Distance(torch.autograd.Function):
    """Σ F·(θ−θ*)²: the value in a few multi-tensor passes; the backward gives each θ its 2·F·(θ−θ*)·ḡ, kept from
    the forward, in θ's dtype: one graph node, however many tensors."""

    @staticmethod
    def forward(ctx, pull: Pull, *params):
        xs = [p if p.dtype == dt else p.to(dt) for p, dt in zip(params, pull.dtypes)]
        d = torch._foreach_sub(xs, pull.anchors)  # a half θ* or F is promoted to θ's compute dtype
        u = d if pull.fisher is None else torch._foreach_mul(d, pull.fisher)  # F·(θ−θ*)
        total = torch.stack(torch._foreach_norm(torch._foreach_mul(d, u), 1)).sum()  # Σ|F·d²| = Σ F·d² (F >= 0)
        ctx.u, ctx.param_dtypes = u, [p.dtype for p in params]
        return total

    @staticmethod
    @once_differentiable  # its gradient carries no graph: a second derivative is refused, not silently zero
    def backward(ctx, grad):
        u, ctx.u = ctx.u, None
        if u is None:  # F·(θ−θ*) became the gradient in place
            raise RuntimeError("the coupled term's backward ran twice; its buffers are freed by the first")
        torch._foreach_mul_(u, grad * 2)
        return (None, *[x if x.dtype == dt else x.to(dt) for x, dt in zip(u, ctx.param_dtypes)])


def distance(pull: Pull) -> Tensor:
    """Σ F·(θ−θ*)² of ``pull``'s tensors at their current values, a 0-dim tensor (no host sync), differentiable
    in θ: the coupled objective's penalty / (γ/2) (``criterions/coupled_term.py``). F ≡ 1 and no F are equal bit
    for bit."""
    if not pull.params:
        return torch.zeros(())
    return _Distance.apply(pull, *pull.params)


def save(path: str, fisher: Dict[str, Tensor], examples: int, source: str) -> None:
    torch.save({"fisher": {n: f.detach().float().cpu() for n, f in fisher.items()}, "examples": int(examples),
                "source": source}, path)


def load(path: str, mmap: bool = False, what: str = "") -> Tuple[Dict[str, Tensor], str]:
    """A Fisher file's {name: F} and a line saying what it holds; ConfigError naming ``what`` (the flag and file).
    ``mmap``: the tensors memory-mapped (a check of the file), not read."""
    where = what or f"{FLAG} {path}"
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file (write one with scripts/fisher.py, or use {FLAG} {TASK})")
    st = checkpoint_file.load(path, where, mmap=mmap)  # refused, cut short, not torch's: one line
    if not isinstance(st, dict) or not isinstance(st.get("fisher"), dict) or not st["fisher"]:
        raise ConfigError(f"{where}: not a Fisher file (scripts/fisher.py writes a dict with a non-empty 'fisher')")
    return dict(st["fisher"]), f"{where} ({st.get('examples', '?')} examples, {st.get('source', '?')})"
