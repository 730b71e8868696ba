"""The RecAdam paper's coupled objective as a term of a criterion's loss (``--recadam-objective coupled``).

Loss = λ(t)·Loss_T + (w − λ(t))·γ/2·Σ(θ − θ*)², for any optimizer: the baseline the paper improves on
by decoupling the pull (``--optimizer recadam``). θ* and λ(t) come from the same code as the
optimizer's (``plumbing/anchor_source.py``, ``core/anneal.py``); t is fairseq's update number
(``plumbing/events.py``).

EWC (``--ewc-fisher``): Σ(θ − θ*)² becomes Σ F·(θ − θ*)², F normalised to mean 1 over the anchored
elements (``fisher_source.py``, ``core/ewc.py``); without it the term is computed as before, bit for bit.

The distance is ``core/ewc.distance``: a few multi-tensor passes and one graph node (its gradient
2·F·(θ−θ*) scaled by what the loss's backward brings: λ, γ, the sample size, fairseq's loss scale), not a
graph over every weight; λ, the distance and the penalty go to the log as tensors, read when fairseq logs
(no host sync per step).
"""

import logging
from typing import Optional

from ..core import ewc
from ..core.anneal import anneal_lambda
from ..plumbing import events
from ..plumbing.anchor_source import build_anchors
from ..plumbing.metrics import RECADAM_METRICS, log_recadam_metrics
from . import fisher_source

logger = logging.getLogger(__name__)


class CoupledObjective:
    """``cfg``: the criterion's config (the ``--recadam-*`` flags and the checkpoint paths)."""

    def __init__(self, cfg, criterion=None):
        self.cfg, self.criterion = cfg, criterion
        self.pull: Optional[ewc.Pull] = None  # θ*, F: at the first training forward
        self.fisher = fisher_source.FisherSource(cfg) if fisher_source.enabled(cfg) else None  # a bad file: now

    def __call__(self, model, target_loss, sample_size: int, logging_output: dict):
        cfg = self.cfg
        if self.pull is None:  # first training forward: fairseq has loaded --restore-file
            params = [p for _, p in model.named_parameters() if p.requires_grad]
            line, anchors, plan = build_anchors(params, model, cfg, resuming_is_error=True)
            pairs = [(p, a, None) for p, a, _ in anchors if a is not None]
            logger.info(f"recadam (coupled objective): {line}")
            if self.fisher is not None:  # F of θ*: before this call's penalty, with θ = θ* still
                self.fisher.compute(self.criterion, model)
                if self.fisher.computed:
                    fisher_source.check_at_theta_star(fisher_source.pieces(anchors), self.fisher.where)
                f = self.fisher.normalised(model, plan.anchored)
                built = (x for _, x, _ in plan.build(f, dtype=fisher_source.fisher_dtype(cfg)) if x is not None)
                pairs = [(p, a, fp) for (p, a, _), fp in zip(pairs, built)]
            self.pull = ewc.Pull(pairs)
        dist = ewc.distance(self.pull)
        penalty = 0.5 * cfg.recadam_pretrain_cof * dist
        w = cfg.recadam_anneal_w
        lam = anneal_lambda(str(cfg.recadam_anneal_fun), events.update_number() + 1, cfg.recadam_anneal_k,
                            cfg.recadam_anneal_t0, w)
        logging_output.update(recadam_lambda=lam, recadam_dist=dist.detach(), recadam_penalty=penalty.detach(),
                              recadam_count=1)
        # fairseq divides gradients by the summed sample size: scale the penalty to survive that
        return lam * target_loss + (w - lam) * penalty * sample_size


def check_fisher_is_read(criterion) -> None:
    """--ewc-fisher weighs a pull: the coupled objective's, or --optimizer recadam's. With the decoupled
    objective and another optimizer nothing would read F: stop rather than train plain. Called when the
    Trainer first puts the criterion in training mode (the optimizer exists by then; the step's crash
    handler, which writes crash.pt, is not yet around)."""
    cfg = criterion.cfg
    if not getattr(criterion, "_fisher_checked", False) and fisher_source.enabled(cfg) \
            and str(cfg.recadam_objective) != "coupled":
        fisher_source.check_read(cfg.ewc_fisher)
    criterion._fisher_checked = True


def reduce(logging_outputs) -> None:
    """λ, the distance and the penalty: the same value on every worker and micro-batch, averaged back."""
    count = sum(x.get("recadam_count", 0) for x in logging_outputs)
    if count:
        log_recadam_metrics(**{k: sum(x.get(k, 0) for x in logging_outputs) / count for k in RECADAM_METRICS})
