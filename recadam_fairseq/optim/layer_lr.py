"""``--layer-lr-decay``: layer-wise learning-rate decay for ``--optimizer recadam`` and ``samsgd``.

fairseq builds the optimizer from unnamed tensors (possibly one flat fp32 copy of all of them), so
the scales (``core/layer_lr.py``) are bound at the first gradient reduction, the first call that
shows the parameters' names, as RecAdam's anchor is. They come from the flag and the names at every
start and are never saved: a resumed run derives the same ones.

recadam scales each tensor, or each element run of the flat tensor, itself (``RecAdam.set_lr_scale``).
samsgd's torch optimizer (fairseq's Adam or FusedAdam) has one param group, whose lr fairseq's
``set_lr`` overwrites, and a checkpoint with another group structure would not load: it takes one
inner step per distinct scale instead (:class:`LayerwiseSteps`).
"""

import logging
from typing import List, Optional, Set, Tuple

import torch

from ..core.errors import ConfigError
from ..core.layer_lr import FLAG, LayerLRPlan, check_gamma
from ..core.recadam import RecAdam

logger = logging.getLogger(__name__)

STATE_KEY = "layer_lr"  # the listener's name; it keeps no state in the checkpoint


class LayerLRDecay:
    """The scales of the optimizer's tensors, bound at the first ``before_reduce(model)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, gamma: float):
        self.opt, self.gamma = optimizer, gamma
        self.scales = None  # [(tensor, None / scale / runs)] once bound
        self._by_scale = []

    def before_reduce(self, model: torch.nn.Module) -> None:
        if self.scales is not None:
            return
        tensors = [p for g in self.opt.param_groups for p in g["params"]]
        plan = LayerLRPlan(tensors, model, self.gamma)
        recadam = isinstance(self.opt, RecAdam)
        if not recadam and any(isinstance(s, list) for s in plan.scales):
            raise ConfigError(
                f"{FLAG} {self.gamma:g} with --optimizer samsgd needs one optimizer tensor per parameter, but --fp16 "
                f"hands it one flat tensor: add --fp16-no-flatten-grads (or use --optimizer recadam, which scales "
                f"the flat tensor's runs)")
        self.scales = list(zip(tensors, plan.scales))
        if recadam:
            for t, s in self.scales:
                self.opt.set_lr_scale(t, s)
        else:  # one number per tensor (checked above)
            groups = {}
            for t, s in self.scales:
                groups.setdefault(1.0 if s is None else s, set()).add(id(t))
            self._by_scale = sorted(groups.items(), key=lambda kv: -kv[0])
        logger.info(plan.summary())

    def by_scale(self) -> List[Tuple[float, Set[int]]]:
        """samsgd's inner steps: (scale, ids of its tensors), largest scale first; empty before binding."""
        return self._by_scale


def add_layer_lr(optimizer, cfg) -> Optional[LayerLRDecay]:
    """The listener for ``cfg.layer_lr_decay`` on a LoopOptimizer, or None at 1 (off: nothing changes)."""
    gamma = float(cfg.layer_lr_decay)
    check_gamma(gamma)
    if gamma == 1.0:
        return None
    if str(getattr(cfg, "zero_sharding", "none")) == "os":  # the scales would go to the unsharded optimizer, unused
        raise ConfigError(f"{FLAG} {gamma:g} does not support --zero-sharding os yet: drop one of them")
    listener = LayerLRDecay(optimizer.optimizer, gamma)
    optimizer.listen(STATE_KEY, listener)
    return listener


class LayerwiseSteps:
    """Mixed in between LoopOptimizer and a FairseqOptimizer whose torch optimizer takes one lr per group:
    with layer-wise decay, each step is one inner step per distinct scale, with the group's lr set to
    lr·scale and the other tensors' gradients hidden (a tensor without a gradient is not updated), then
    lr and the gradients put back. The saved state keeps fairseq's group structure.
    """

    layer_lr = None  # the LayerLRDecay listener; None: off

    def step(self, closure=None, scale=1.0, groups=None):
        plan = self.layer_lr.by_scale() if self.layer_lr is not None else []
        if not plan or [c for c, _ in plan] == [1.0]:
            return super().step(closure, scale, groups)
        if scale != 1.0 and not self.supports_step_with_scale:  # unscale once, as fairseq's step would
            self.multiply_grads(1.0 / scale)
            scale = 1.0
        saved = [(g, g["lr"], g.get("step")) for g in self.optimizer.param_groups]
        grads = [(p, p.grad) for g in self.optimizer.param_groups for p in g["params"]]
        try:
            for c, members in plan:
                for g, lr, step in saved:
                    g["lr"] = lr * c
                    if step is None:  # a per-group step count (apex's FusedAdam) must advance once per update
                        g.pop("step", None)
                    else:
                        g["step"] = step
                for p, grad in grads:
                    p.grad = grad if id(p) in members else None
                super().step(closure, scale, groups)
        finally:
            for g, lr, _ in saved:
                g["lr"] = lr
            for p, grad in grads:
                p.grad = grad
