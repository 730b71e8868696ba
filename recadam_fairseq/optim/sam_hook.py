"""The SAM family inside fairseq's unmodified Trainer: where the second pass comes from.

fairseq hands the optimizer no closure. The hook is a forward pre-hook on the CRITERION (a
documented torch extension point): fairseq's ``task.train_step`` calls ``criterion(model, sample)``
for every training micro-batch, so just before it we run pass 1 ourselves (forward + backward at θ
through the unwrapped model, ``torch.autograd.grad``: ``.grad`` and DDP untouched), put θ ← θ + ε,
and let fairseq's own forward/backward (its loss scale, its fp16 wrapper, its ``--update-freq``)
compute ∇L(θ+ε) into ``.grad``. θ is restored exactly from saved values at the next micro-batch and
in ``all_reduce_grads`` (called before every update, before the overflow check and the step).

The criterion is found through torch's global ``register_module_forward_pre_hook`` on the first
training call of a FairseqCriterion; the global hook then removes itself. Pass 1 runs under
``torch.random.fork_rng``: pass 2 sees the same dropout masks and fairseq's RNG stream is unchanged.

ε is per rank and per micro-batch (m-sharpness, as Foret et al. do per accelerator). GSAM's
decomposition and the Fisher mask use the update's gradients summed over micro-batches and ranks,
so all ranks agree and N ranks equal one process with ``--update-freq N``.
"""

import logging
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion

from ..core.errors import ConfigError
from ..report import log_sam_metrics
from ..sam import (Perturbed, base_type, esam_select_examples, esam_select_params, fisher_mask, global_norm,
                   gsam_decompose, gsam_rho, mask_eligible, perturbation, uses_mask)

logger = logging.getLogger(__name__)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _subset(x, idx: torch.Tensor, n: int):
    """The examples ``idx`` of a fairseq sample (tensors / lists whose first dimension is the batch)."""
    if torch.is_tensor(x):
        return x.index_select(0, idx.to(x.device)) if x.dim() > 0 and x.shape[0] == n else x
    if isinstance(x, dict):
        return {k: _subset(v, idx, n) for k, v in x.items()}
    if isinstance(x, list) and len(x) == n:
        return [x[i] for i in idx.tolist()]
    return x


class SAMController:
    """Pass 1, ε, exact restore, GSAM's decomposition and the Fisher mask for one optimizer.

    ``t`` counts completed updates; the mask, ``t``, ESAM's generator and the pass-1 loss scale are the
    state that :meth:`state_dict` hands to the optimizer's checkpoint state.
    """

    def __init__(self, h: Dict, lr_of, lr_max: float, seed: int = 1):
        self.h = h
        self.sam_type = str(h["sam_type"])
        self.base = base_type(self.sam_type)
        self.masked = uses_mask(self.sam_type)
        self.lr_of, self.lr_max = lr_of, lr_max
        self.gen = torch.Generator().manual_seed(seed)
        self.t = 0
        self.mask: Optional[List[Optional[torch.Tensor]]] = None
        self.scale: Optional[float] = None
        self.pert = Perturbed()
        self.model = self.wrapped = None
        self.params: List[torch.Tensor] = []
        self.names: List[str] = []
        self._loaded = None
        self._in_pass1 = False
        self._in_update = False
        self._committed = True
        self._pending = None
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._global_pre_hook)

    # ------------------------------------------------------------------ attaching
    def _global_pre_hook(self, module, args):
        if self._in_pass1 or not isinstance(module, FairseqCriterion) or not self._training(args):
            return None
        self._hook.remove()
        self._attach(module, args[0])
        return self._pre_hook(module, args)  # the instance hook registered now fires from the next call on

    @staticmethod
    def _training(args) -> bool:
        return (torch.is_grad_enabled() and len(args) >= 2 and isinstance(args[0], torch.nn.Module)
                and args[0].training)

    def _attach(self, criterion, model) -> None:
        if self.base == "esam" and (getattr(criterion, "handles_multitask", False)
                                    or not (hasattr(criterion, "classification_head_name")
                                            and hasattr(criterion, "regression_target"))):
            raise ConfigError(
                f"--sam-type {self.sam_type}: ESAM's data selection needs per-example losses, computed here for the "
                f"single-task sentence_prediction criteria (fairseq's sentence_prediction, sentence_prediction_recadam, "
                f"sentence_prediction_r3f); "
                f"--criterion {type(criterion).__name__} is not one of them. Use --sam-type sam/gsam/fisher-sam/fisher-gsam"
            )
        self.wrapped, self.model = model, unwrap(model)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.eligible = [mask_eligible(n) for n in self.names]
        if self.scale is None:
            self.scale = 128.0 if self.params[0].dtype in (torch.float16, torch.bfloat16) else 1.0  # fairseq's initial scale
        if self._loaded is not None:
            self._apply_loaded(self._loaded)
            self._loaded = None
        criterion.register_forward_pre_hook(self._pre_hook)
        criterion.register_forward_hook(self._post_hook)
        logger.info(f"sam: {self.sam_type} on {len(self.params)} parameter tensors via a forward pre-hook on "
                    f"{type(criterion).__name__}")

    # ------------------------------------------------------------------ per micro-batch
    def _pre_hook(self, criterion, args):
        if self._in_pass1 or not self._training(args):
            return None
        self.pert.restore()
        self._flush()
        if not self._in_update:
            self._start_update()
        return self._pass1(criterion, args)

    def _post_hook(self, criterion, args, output):
        if self._in_pass1 or self._pending is None or not self._training(args):
            return
        pend, loss = self._pending, output[0]
        if pend["l2"] is None:
            pend["l2"] = loss.detach()
        if loss.requires_grad:  # the gradient fairseq feeds into the loss: its loss scale (0 for dummy batches)
            loss.register_hook(lambda g: pend.__setitem__("s", g.detach()))

    def _start_update(self) -> None:
        if not self._committed:  # the previous update was skipped (overflow): draw ESAM's choices again
            self.gen.set_state(self._gen_state)
        self._gen_state = self.gen.get_state()
        self._committed = False
        self._in_update = True
        self._poison = False
        self._g1 = None
        self._next_mask = None
        self._build_mask = self.masked and self.t % int(self.h["mask_iter_e"]) == 0
        self._need_g1 = self.base == "gsam" or self._build_mask
        self.rho_t = (gsam_rho(self.h["rho"], self.h["rho_min"], self.lr_of(), self.lr_max)
                      if self.base == "gsam" else self.h["rho"])
        self._stats = {"eps": 0.0, "sharp": 0.0, "n": 0.0, "frac": 0.0, "k": 0}

    def _per_example_loss(self, criterion, sample) -> torch.Tensor:
        """The sentence_prediction losses, one per example (their sum is the criterion's loss)."""
        logits, _ = self.model(**sample["net_input"], features_only=True,
                               classification_head_name=criterion.classification_head_name)
        targets = self.model.get_targets(sample, [logits]).view(-1)
        dt = torch.promote_types(logits.dtype, torch.float32)  # fp32 as fairseq's criterion, fp64 in tests
        if criterion.regression_target:
            return F.mse_loss(logits.view(-1).to(dt), targets.to(dt), reduction="none")
        return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=dt), targets, reduction="none")

    def _pass1(self, criterion, args):
        model, sample = args[0], args[1]
        esam = self.base == "esam"
        keep = esam_select_params(len(self.params), self.h["beta"], self.gen) if esam else [True] * len(self.params)
        sub = [p for p, k in zip(self.params, keep) if k]
        cuda = [self.params[0].device.index or 0] if self.params[0].is_cuda else []
        new_args = None
        with torch.random.fork_rng(devices=cuda):
            rng = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in cuda]
            self._in_pass1 = True
            try:
                with torch.enable_grad():
                    if esam:
                        lb = self._per_example_loss(criterion, sample)
                        loss, n = lb.sum(), lb.numel()
                    else:
                        loss, n, _ = criterion(self.model, sample)
                    grads = torch.autograd.grad(loss * self.scale, sub, allow_unused=True) if sub else []
                it = iter(grads)
                u = [next(it) if k else None for k in keep]
                u = [None if g is None else (g.to(_acc(g)) / self.scale if self.scale != 1.0 else g) for g in u]
                gnorm = global_norm(u)
                if not torch.isfinite(gnorm):  # skip the update: fairseq's overflow check fires (all_reduce_grads)
                    self._poison = True
                    self._pending = None
                    return None
                masks = None
                if self.masked:
                    mask = self.mask
                    if mask is None:  # first update: each micro-batch its own mask, until the reduced one is committed
                        mask = fisher_mask([None if not e else torch.zeros_like(p, dtype=_acc(p)) if g is None
                                            else g * g for g, e, p in zip(u, self.eligible, self.params)],
                                           self.h["keep_ratio"])
                    masks = mask
                divisor = self.h["beta"] if esam else self.h["keep_ratio"] if self.sam_type == "fisher-gsam" else 1.0
                eps, _ = perturbation(u, self.rho_t, divisor, masks)
                self.pert.apply(self.params, eps)
                pend = {"l1": loss.detach(), "l2": None, "n": float(n), "s": None,
                        "eps": global_norm(eps), "frac": self._fraction(eps, masks),
                        "g": u if self._need_g1 else None}
                if esam:
                    torch.set_rng_state(rng[0])
                    for d, st in zip(cuda, rng[1]):
                        torch.cuda.set_rng_state(st, d)
                    with torch.no_grad():
                        la = self._per_example_loss(criterion, sample)
                    pend["l2"] = la.sum()
                    idx = esam_select_examples(lb.detach(), la, self.h["gamma"])
                    sel = _subset(sample, idx, lb.numel())
                    sel["nsentences"] = idx.numel()
                    lengths = sel.get("net_input", {}).get("src_lengths")
                    if torch.is_tensor(lengths) and "ntokens" in sel:
                        sel["ntokens"] = int(lengths.sum())
                    new_args = (model, sel, *args[2:])
            finally:
                self._in_pass1 = False
        self._pending = pend
        return new_args

    def _fraction(self, eps, masks) -> float:
        total = sum(p.numel() for p in self.params)
        hit = 0
        for i, (e, p) in enumerate(zip(eps, self.params)):
            if e is None:
                continue
            m = None if masks is None else masks[i]
            hit += p.numel() if m is None else int(m.sum())
        return hit / total

    def _flush(self) -> None:
        """Book the last micro-batch once its backward has shown the loss scale (0: a dummy batch, ignored)."""
        pend, self._pending = self._pending, None
        if pend is None or pend["s"] is None or float(pend["s"]) == 0:
            return
        s = float(pend["s"])
        self.scale = s
        st = self._stats
        st["eps"] += float(pend["eps"])
        st["frac"] += pend["frac"]
        st["k"] += 1
        if pend["l2"] is not None:
            st["sharp"] += float(pend["l2"] - pend["l1"])
            st["n"] += pend["n"]
        if pend["g"] is not None:
            g = [torch.zeros_like(p, dtype=_acc(p)) if x is None else x.to(_acc(p)) for x, p in zip(pend["g"], self.params)]
            if self._g1 is None:
                self._g1 = g
            else:
                torch._foreach_add_(self._g1, g)

    # ------------------------------------------------------------------ per update (optimizer side)
    def before_reduce(self, module) -> bool:
        """θ back, bit for bit; a non-finite pass 1 poisons ``.grad`` so fairseq skips the update."""
        if module is not self.wrapped or not self._in_update:
            return False
        self.pert.restore()
        self._flush()
        self._in_update = False
        if self._poison:
            p = self.params[0]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.fill_(float("nan"))
        return True

    @torch.no_grad()
    def after_reduce(self) -> None:
        if self._poison or self._g1 is None:
            return
        g1 = self._g1
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            world = torch.distributed.get_world_size()
            for g in g1:  # DDP (legacy and pytorch) averages .grad over ranks: so does G1
                torch.distributed.all_reduce(g)
                g.div_(world)
        if self.base == "gsam":  # both in the units of .grad (pass 2): scale by fairseq's loss scale
            gsam_decompose([p.grad for p in self.params], [g.mul(self.scale) for g in g1], self.h["gsam_alpha"])
        if self._build_mask:
            self._next_mask = fisher_mask([g * g if e else None for g, e in zip(g1, self.eligible)],
                                          self.h["keep_ratio"])
        self._g1 = None

    def after_step(self) -> None:
        self.t += 1
        self._committed = True
        if self._next_mask is not None:
            self.mask = self._next_mask
            self._next_mask = None
        st = getattr(self, "_stats", None)
        if st and st["k"]:
            log_sam_metrics(rho=self.rho_t, eps_norm=st["eps"] / st["k"], mask_frac=st["frac"] / st["k"],
                            sharpness=st["sharp"] / st["n"] if st["n"] else 0.0)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict:
        return {"t": self.t, "scale": self.scale, "gen": self.gen.get_state(),
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
