"""One optimizer's SAM family: pass 1, ε, the exact restore, GSAM's decomposition and the Fisher mask.

Pure torch. The fairseq adapter (``optim/sam_support.py``) connects it to fairseq's loop through
``plumbing/events.py``: :meth:`SAMController.attach` when the criterion first trains, :meth:`before_forward`
and :meth:`after_forward` around every training call of the criterion, :meth:`before_reduce`,
:meth:`after_reduce` and :meth:`after_step` from the optimizer.

Per micro-batch, just before fairseq's ``criterion(model, sample)``, pass 1 runs here (forward and
``torch.autograd.grad`` at θ through the unwrapped model: ``.grad`` and DDP untouched), θ ← θ + ε,
and fairseq's own forward/backward (its loss scale, fp16 wrapper and ``--update-freq``) computes
∇L(θ+ε) into ``.grad``. θ is restored bit for bit from saved values at the next micro-batch and
before the gradient reduction. Pass 1 runs under ``torch.random.fork_rng``: pass 2 sees the same
dropout masks and fairseq's RNG stream is unchanged.

ε is per rank and per micro-batch (m-sharpness, as Foret et al. do per accelerator). GSAM's
decomposition and the Fisher mask use the update's pass-1 gradients summed over micro-batches and
averaged over ranks, so all ranks agree and N ranks equal one process with ``--update-freq N``.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from .errors import ConfigError
from .sam import (Perturbed, accumulation_dtype, base_type, esam_select_examples, esam_select_params, fisher_mask,
                  global_norm, gsam_decompose, gsam_rho, mask_eligible, perturbation, uses_mask)
from .wrappers import unwrap_model


def subset(x, idx: torch.Tensor, n: int):
    """The examples ``idx`` of a batch of ``n`` (in nested dicts, the tensors / lists whose first dimension is
    the batch; the rest as is)."""
    if torch.is_tensor(x):
        return x.index_select(0, idx.to(x.device)) if x.dim() > 0 and x.shape[0] == n else x
    if isinstance(x, dict):
        return {k: subset(v, idx, n) for k, v in x.items()}
    if isinstance(x, list) and len(x) == n:
        return [x[i] for i in idx.tolist()]
    return x


class MicroBatch:
    """What pass 1 of one micro-batch leaves for the books, until fairseq's backward shows its loss scale."""

    def __init__(self, loss_at_theta, n_examples, eps_norm, perturbed_fraction, grads):
        self.loss_at_theta = loss_at_theta  # L(θ), summed over the examples
        self.loss_at_eps: Optional[torch.Tensor] = None  # L(θ+ε) (ESAM: on the whole micro-batch)
        self.n_examples = n_examples
        self.eps_norm = eps_norm
        self.perturbed_fraction = perturbed_fraction
        self.grads = grads  # the unscaled pass-1 gradient, kept when GSAM or a new Fisher mask needs it
        self.loss_scale: Optional[torch.Tensor] = None  # the gradient fairseq's backward sent into the loss


@dataclass
class Update:
    """One update's state, from its first micro-batch to its step (``SAMController.update``)."""
    rho: float = 0.0  # ρ_t (GSAM: from the lr)
    gen_state: Optional[torch.Tensor] = None  # ESAM's generator at the start: drawn again if the update is skipped
    build_mask: bool = False  # a new Fisher mask from this update's pass-1 gradients
    keep_grads: bool = False  # the pass-1 gradients are kept (GSAM, a new mask)
    poison: bool = False  # a non-finite pass 1: fairseq is made to skip the update
    summed_grads: Optional[List[torch.Tensor]] = None  # Σ over micro-batches of the pass-1 gradients
    next_mask: Optional[List[Optional[torch.Tensor]]] = None  # the Fisher mask committed at the step
    # the figures logged at the step, summed over the booked micro-batches
    eps: float = 0.0
    sharpness: float = 0.0
    examples: float = 0.0
    fraction: float = 0.0
    micro_batches: int = 0


class SAMController:
    """``hp``: sam_type, rho, beta, gamma, keep_ratio, mask_iter_e, gsam_alpha, rho_min (plumbing/config.py's flags).

    ``lr_of()`` gives the current lr and ``lr_max`` the peak one (GSAM's ρ_t); ``log(rho, eps_norm,
    mask_frac, sharpness)`` receives each update's figures. ``t`` counts committed updates; the mask,
    ``t``, ESAM's generator and the loss scale are the state :meth:`state_dict` hands to the checkpoint;
    ``update`` the state of the update in progress (or the last one).
    """

    def __init__(self, hp: Dict, lr_of: Callable[[], float], lr_max: float, seed: int = 1,
                 log: Optional[Callable[..., None]] = None):
        self.hp = hp
        self.sam_type = str(hp["sam_type"])
        self.base = base_type(self.sam_type)
        self.masked = uses_mask(self.sam_type)
        self.lr_of, self.lr_max, self.log = lr_of, lr_max, log
        self.gen = torch.Generator().manual_seed(seed)
        self.t = 0
        self.mask: Optional[List[Optional[torch.Tensor]]] = None
        self.scale: Optional[float] = None
        self.perturbed = Perturbed()
        self.model = self.wrapped = None
        self.params: List[torch.Tensor] = []
        self.names: List[str] = []
        self.eligible: List[bool] = []
        self.per_example_loss = None
        self.watch_loss_scale = None
        self.select_examples = subset
        self._loaded = None  # checkpoint state that arrived before attach()
        self._in_pass1 = False
        self._in_update = False
        self._reduced = False
        self._committed = True
        self._pending: Optional[MicroBatch] = None
        self.update = Update()

    # ------------------------------------------------------------------ attaching
    def attach(self, model: torch.nn.Module, per_example_loss=None,
               watch_loss_scale: Optional[Callable] = None, select_examples: Optional[Callable] = None) -> None:
        """The (wrapped) model fairseq trains; ``per_example_loss(model, sample)`` and
        ``select_examples(sample, idx, n)`` (the sample of the examples ``idx`` of its ``n``; default
        :func:`subset`) for ESAM; ``watch_loss_scale(loss, callback)`` reports the gradient fairseq's
        backward sends into the loss."""
        self.wrapped, self.model = model, unwrap_model(model)
        self.per_example_loss, self.watch_loss_scale = per_example_loss, watch_loss_scale
        self.select_examples = select_examples or subset
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.eligible = [mask_eligible(n) for n in self.names]
        if self.scale is None:  # fairseq's initial fp16 loss scale; 1 in fp32
            self.scale = 128.0 if self.params[0].dtype in (torch.float16, torch.bfloat16) else 1.0
        if self._loaded is not None:
            self._apply_loaded(self._loaded)
            self._loaded = None

    # ------------------------------------------------------------------ per micro-batch
    def before_forward(self, criterion, args):
        """Pass 1 for this micro-batch; returns new criterion args (ESAM's selected examples) or None."""
        if self._in_pass1:
            return None
        self.perturbed.restore()
        self._book()
        if not self._in_update:
            self._start_update()
        return self._pass1(criterion, args)

    def after_forward(self, criterion, args, output) -> None:
        if self._in_pass1 or self._pending is None:
            return
        pending, loss = self._pending, output[0]
        if pending.loss_at_eps is None:
            pending.loss_at_eps = loss.detach()
        if self.watch_loss_scale is not None:
            self.watch_loss_scale(loss, lambda g: setattr(pending, "loss_scale", g))

    def _start_update(self) -> None:
        if not self._committed:  # the previous update was skipped (fp16 overflow): draw ESAM's choices again
            self.gen.set_state(self.update.gen_state)
        self._committed = False
        self._in_update = True
        build_mask = self.masked and self.t % int(self.hp["mask_iter_e"]) == 0
        self.update = Update(
            rho=(gsam_rho(self.hp["rho"], self.hp["rho_min"], self.lr_of(), self.lr_max) if self.base == "gsam"
                 else self.hp["rho"]),
            gen_state=self.gen.get_state(), build_mask=build_mask, keep_grads=self.base == "gsam" or build_mask)

    def _pass1(self, criterion, args):
        model, sample = args[0], args[1]
        esam = self.base == "esam"
        chosen = (esam_select_params(len(self.params), self.hp["beta"], self.gen) if esam
                  else [True] * len(self.params))
        perturbed_params = [p for p, c in zip(self.params, chosen) if c]
        cuda = [self.params[0].device.index or 0] if self.params[0].is_cuda else []
        new_args = None
        with torch.random.fork_rng(devices=cuda):
            rng = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in cuda]
            self._in_pass1 = True
            try:
                with torch.enable_grad():
                    if esam:
                        losses_at_theta = self.per_example_loss(self.model, sample)
                        loss, n_examples = losses_at_theta.sum(), losses_at_theta.numel()
                    else:
                        loss, n_examples, _ = criterion(self.model, sample)
                    found = (torch.autograd.grad(loss * self.scale, perturbed_params, allow_unused=True)
                             if perturbed_params else [])
                it = iter(found)
                grads = [next(it) if c else None for c in chosen]
                grads = [None if g is None else (g.to(accumulation_dtype(g)) / self.scale if self.scale != 1.0 else g)
                         for g in grads]
                if not torch.isfinite(global_norm(grads)):  # fairseq's overflow check skips the update
                    self.update.poison = True
                    self._pending = None
                    return None
                masks = None
                if self.masked:
                    masks = self.mask
                    if masks is None:  # first update: each micro-batch its own mask, until the reduced one is committed
                        masks = fisher_mask([None if not e else torch.zeros_like(p, dtype=accumulation_dtype(p))
                                             if g is None else g * g
                                             for g, e, p in zip(grads, self.eligible, self.params)],
                                            self.hp["keep_ratio"])
                divisor = (self.hp["beta"] if esam else self.hp["keep_ratio"] if self.sam_type == "fisher-gsam"
                           else 1.0)
                eps, _ = perturbation(grads, self.update.rho, divisor, masks)
                self.perturbed.apply(self.params, eps)
                pending = MicroBatch(loss.detach(), float(n_examples), global_norm(eps), self._fraction(eps, masks),
                                     grads if self.update.keep_grads else None)
                if esam:  # the loss rise under ε with pass 2's dropout masks, then the top-γ examples
                    torch.set_rng_state(rng[0])
                    for d, st in zip(cuda, rng[1]):
                        torch.cuda.set_rng_state(st, d)
                    with torch.no_grad():
                        losses_at_eps = self.per_example_loss(self.model, sample)
                    pending.loss_at_eps = losses_at_eps.sum()
                    idx = esam_select_examples(losses_at_theta.detach(), losses_at_eps, self.hp["gamma"])
                    new_args = (model, self.select_examples(sample, idx, losses_at_theta.numel()), *args[2:])
            finally:
                self._in_pass1 = False
        self._pending = pending
        return new_args

    def _fraction(self, eps, masks) -> float:
        """The share of the trainable elements ε touches."""
        total = sum(p.numel() for p in self.params)
        hit = 0
        for i, (e, p) in enumerate(zip(eps, self.params)):
            if e is None:
                continue
            m = None if masks is None else masks[i]
            hit += p.numel() if m is None else int(m.sum())
        return hit / total

    def _book(self) -> None:
        """Book the last micro-batch once its backward has shown the loss scale (0: a dummy batch, ignored)."""
        pending, self._pending = self._pending, None
        if pending is None or pending.loss_scale is None or float(pending.loss_scale) == 0:
            return
        self.scale = float(pending.loss_scale)
        u = self.update
        u.eps += float(pending.eps_norm)
        u.fraction += pending.perturbed_fraction
        u.micro_batches += 1
        if pending.loss_at_eps is not None:
            u.sharpness += float(pending.loss_at_eps - pending.loss_at_theta)
            u.examples += pending.n_examples
        if pending.grads is not None:
            g = [torch.zeros_like(p, dtype=accumulation_dtype(p)) if x is None else x.to(accumulation_dtype(p))
                 for x, p in zip(pending.grads, self.params)]
            if u.summed_grads is None:
                u.summed_grads = g
            else:
                torch._foreach_add_(u.summed_grads, g)

    # ------------------------------------------------------------------ per update (optimizer side)
    def before_reduce(self, module) -> bool:
        """θ back, bit for bit; a non-finite pass 1 fills ``.grad`` with NaN so fairseq skips the update.
        False when the reduction is not of this update's model (fairseq also reduces the criterion's)."""
        self._reduced = module is self.wrapped and self._in_update
        if not self._reduced:
            return False
        self.perturbed.restore()
        self._book()
        self._in_update = False
        if self.update.poison:
            p = self.params[0]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.fill_(float("nan"))
        return True

    @torch.no_grad()
    def after_reduce(self, module=None) -> None:
        u = self.update
        if not self._reduced or u.poison or u.summed_grads is None:
            return
        summed = u.summed_grads
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            world = torch.distributed.get_world_size()
            for g in summed:  # DDP (legacy and pytorch) averages .grad over ranks: so is the pass-1 sum
                torch.distributed.all_reduce(g)
                g.div_(world)
        if self.base == "gsam":  # both in the units of .grad (pass 2): scale by fairseq's loss scale
            gsam_decompose([p.grad for p in self.params], [g.mul(self.scale) for g in summed], self.hp["gsam_alpha"])
        if u.build_mask:
            u.next_mask = fisher_mask([g * g if e else None for g, e in zip(summed, self.eligible)],
                                      self.hp["keep_ratio"])
        u.summed_grads = None

    def after_step(self) -> None:
        self.t += 1
        self._committed = True
        u = self.update
        if u.next_mask is not None:
            self.mask = u.next_mask
            u.next_mask = None
        if u.micro_batches and self.log is not None:
            k = u.micro_batches
            self.log(rho=u.rho, eps_norm=u.eps / k, mask_frac=u.fraction / k,
                     sharpness=u.sharpness / u.examples if u.examples else 0.0)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict:
        # after a skipped (fp16 overflow) update fairseq may save before the next one: the generator as
        # that update will rewind it, so a resumed run draws what an uninterrupted one draws
        gen = self.gen.get_state() if self._committed else self.update.gen_state
        return {"t": self.t, "scale": self.scale, "gen": gen,
                "mask": None if self.mask is None else [None if m is None else m.cpu() for m in self.mask]}

    def load_state_dict(self, st: Dict) -> None:
        self.t, self.scale = int(st["t"]), st["scale"]
        self.gen.set_state(st["gen"])
        if self.params:
            self._apply_loaded(st)
        else:
            self._loaded = st

    def _apply_loaded(self, st: Dict) -> None:
        mask = st.get("mask")
        if mask is not None:
            if len(mask) != len(self.params) or any(m is not None and m.shape != p.shape
                                                     for m, p in zip(mask, self.params)):
                raise ConfigError("sam: the checkpoint's Fisher mask does not fit this model; start with "
                                 "--reset-optimizer")
            mask = [None if m is None else m.to(p.device) for m, p in zip(mask, self.params)]
        self.mask = mask
