"""``--optimizer samsgd``: the FSAM authors' optimizer name (Zhong et al., Findings of EMNLP 2022).

The base optimizer is fairseq's own ``adam`` (the authors' samsgd wraps Adam too: torch.optim.Adam,
whose weight decay is L2; fairseq's is decoupled, AdamW): with ``--sam-type none`` or ``--rho 0``
this is ``--optimizer adam`` bit for bit. The perturbation comes from ``sam_support.py``.
"""

import logging
from dataclasses import dataclass

from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from omegaconf import II

from .. import meters
from ..plumbing.config import (ChildTuningHyperparams, CheckpointPaths, ForgettingMeterConfig, LayerLRHyperparams,
                               SAMHyperparams, check_checkpoint_paths)
from ..plumbing.events import LoopOptimizer
from .child_tuning import add_child_tuning
from .layer_lr import LayerwiseSteps, add_layer_lr
from .sam_support import add_sam

logger = logging.getLogger(__name__)


@dataclass
class SAMSGDConfig(SAMHyperparams, LayerLRHyperparams, ChildTuningHyperparams, ForgettingMeterConfig, CheckpointPaths,
                   FairseqAdamConfig):
    seed: int = II("common.seed")


@register_optimizer("samsgd", dataclass=SAMSGDConfig)
class SAMSGD(LoopOptimizer, LayerwiseSteps, FairseqAdam):
    """fairseq's Adam with a sharpness-aware gradient (SAM, ESAM, GSAM, and their Fisher-masked forms);
    ``--layer-lr-decay`` scales each layer's lr (``layer_lr.py``: one inner step per distinct scale);
    ``--child-tuning`` masks the gradient (``child_tuning.py``)."""

    def __init__(self, cfg: SAMSGDConfig, params):
        super().__init__(cfg, params)
        check_checkpoint_paths(cfg)
        meters.install(cfg)  # --forgetting-probe: before SAM's first pass 1 moves θ
        add_child_tuning(self, cfg)  # the listeners, in the order of events.LISTENERS (which says why)
        add_sam(self, cfg, seed=cfg.seed)
        self.layer_lr = add_layer_lr(self, cfg)
        if str(cfg.sam_type) == "none":
            logger.warning("samsgd with --sam-type none: plain Adam (set --sam-type sam, esam, gsam, fisher-sam, ...)")
