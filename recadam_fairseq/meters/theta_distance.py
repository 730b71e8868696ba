"""‖θ − θ*‖², logged as ``recadam_dist`` by the GLUE criteria when nothing else logs it: the decoupled objective
over an optimizer that holds no θ* (fairseq's ``adam``, ``samsgd``). ``--optimizer recadam`` logs it from its
step, the coupled objective from its term; so every run of the plug-in's criteria says how far it went.

The same sum as RecAdam's: over the trainable parameters whose names and shapes the pretrained checkpoint has
(after the model's own upgrade of its keys; new heads are not in it), on log steps only (``--log-interval``:
it costs a pass over the weights), of the weights after the step (the number RecAdam logs at that update).
θ* is not copied: it is read, tensor by tensor, from the memory-mapped checkpoint fairseq loaded the weights
from (``plumbing/anchor_source.py``: its restore rule), rounded to the weights' dtype (a --fp16 model's distance starts
at 0); on a GPU each tensor crosses to the device at each log step (about 1.4 GB for RoBERTa-large, every
--log-interval updates). A run resumed from a checkpoint the plug-in wrote, without --finetune-from-model naming θ*, logs none
(its warning says why).
"""

import logging
from typing import List, Optional, Tuple

import torch

from ..core import anchor
from ..core.anchor import AnchorError
from ..core.wrappers import unwrap_model
from ..plumbing import events
from ..plumbing.anchor_source import anchor_source, quiet_upgrade
from ..plumbing.metrics import RECADAM_METRICS

logger = logging.getLogger(__name__)

DUE = "recadam_dist_due"  # a training forward whose update is a log step (logging output key)
_reported_by_optimizer = False  # this process built an optimizer that logs recadam_dist (--optimizer recadam)
_active: List["ThetaDistance"] = []  # the criterion's meter, for reduce_metrics (a static method)


def optimizer_reports_it() -> None:
    global _reported_by_optimizer
    _reported_by_optimizer = True


def install(criterion) -> Optional["ThetaDistance"]:
    """When fairseq first puts the criterion in training mode (the optimizer is built by then; ``meters.install``):
    a meter for the decoupled objective over an optimizer that logs no distance, else None."""
    if _reported_by_optimizer or str(getattr(criterion.cfg, "recadam_objective", "decoupled")) == "coupled":
        return None
    meter = ThetaDistance(criterion.cfg)
    events.forward_hooks(criterion, lambda module, args: None, meter.after_forward)
    _active[:] = [meter]
    return meter


class ThetaDistance:
    def __init__(self, cfg):
        self.cfg = cfg
        self.interval = max(1, int(getattr(cfg, "log_interval", 100) or 100))
        self.pairs: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None  # (θ, θ* memory-mapped)
        self.off = False

    def after_forward(self, criterion, args, output) -> None:
        """A training forward: θ* matched to the model once; the logging output marked when the step it is part
        of ends on a log step."""
        if self.off:
            return
        if self.pairs is None:
            self.pairs = self.match(unwrap_model(args[0]))
            if self.pairs is None:
                return
        if (events.update_number() + 1) % self.interval == 0:
            output[2][DUE] = 1

    def match(self, model) -> Optional[List[Tuple[torch.Tensor, torch.Tensor]]]:
        try:
            line, state, _ = anchor_source(self.cfg, resuming_is_error=True)
        except AnchorError as e:
            logger.warning(f"recadam_dist: not logged ({e})")
            self.off = True
            return None
        pre = anchor.pretrained_names(model, state, quiet_upgrade(model))
        pairs = [(p, pre[n]) for n, p in anchor.trainable_named_parameters(model)
                 if n in pre and tuple(pre[n].shape) == tuple(p.shape)]
        if not pairs:  # (FSDP's flat parameters, a model of other names): no number rather than a wrong 0
            logger.warning(f"recadam_dist: not logged (no parameter of the model is in θ*'s {line} by name and shape)")
            self.off = True
            return None
        logger.info(f"recadam_dist: ‖θ − θ*‖² over {len(pairs)} tensors ({sum(p.numel() for p, _ in pairs):,} "
                    f"elements) every {self.interval} updates, θ* from {line}")
        return pairs

    def distance(self) -> float:
        total = None
        with torch.no_grad():
            for p, a in self.pairs:
                d = p.detach().float() - a.to(device=p.device, dtype=p.dtype).float()  # fp16: exact in fp32
                d = d.square().sum(dtype=torch.float64)
                total = d if total is None else total + d
        return 0.0 if total is None else float(total)


def reduce(logging_outputs) -> None:
    """After the step (reduce_metrics runs then): the distance of the new weights, on a log step's training
    outputs (the key is absent from validation's)."""
    if _active and _active[0].pairs is not None and any(x.get(DUE) for x in logging_outputs):
        from fairseq.logging import metrics

        metrics.log_scalar(RECADAM_METRICS[1], _active[0].distance(), weight=0, priority=301)
