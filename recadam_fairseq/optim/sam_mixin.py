"""What an optimizer adapter adds to run the SAM family (``--sam-type``): shared by samsgd and recadam."""

import logging
from collections.abc import Collection

from ..sam import validate_sam_hparams
from .sam_hook import SAMController

SAM_KEYS = ("sam_type", "rho", "beta", "gamma", "keep_ratio", "num_samples", "mask_iter_e", "gsam_alpha", "rho_min")
STATE_KEY = "sam"
logger = logging.getLogger(__name__)  # the controller's state inside the optimizer's state dict (checkpoint_last.pt)


def sam_hparams(cfg) -> dict:
    return {k: (str(getattr(cfg, k)) if k == "sam_type" else getattr(cfg, k)) for k in SAM_KEYS}


class SAMOptimizerMixin:
    """Put before the FairseqOptimizer subclass: builds the controller, restores θ before the gradient
    reduction, applies GSAM/Fisher after it, commits the state after each step, checkpoints it."""

    def init_sam(self, cfg, seed: int = 1) -> None:
        h = sam_hparams(cfg)
        validate_sam_hparams(h)
        lrs = cfg.lr if isinstance(cfg.lr, Collection) else [cfg.lr]
        if h["sam_type"] != "none" and h["rho"] == 0:  # ε = 0: the second pass would compute ∇L(θ) again
            logger.warning(f"--sam-type {h['sam_type']} with --rho 0: ε is 0, so no second pass is run "
                           f"(the base optimizer's update alone)")
            h["sam_type"] = "none"
        self._sam = None if h["sam_type"] == "none" else SAMController(h, self.get_lr, max(lrs), seed=seed)

    def all_reduce_grads(self, module):
        sam = getattr(self, "_sam", None)
        ours = sam is not None and sam.before_reduce(module)
        super().all_reduce_grads(module)
        if ours:
            sam.after_reduce()

    def step(self, closure=None, scale=1.0, groups=None):
        super().step(closure, scale, groups)
        if getattr(self, "_sam", None) is not None:
            self._sam.after_step()

    def state_dict(self):
        st = super().state_dict()
        if getattr(self, "_sam", None) is not None:
            st = {**st, STATE_KEY: self._sam.state_dict()}
        return st

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        state_dict = dict(state_dict)
        sam_state = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict, optimizer_overrides)
        if sam_state is not None and getattr(self, "_sam", None) is not None:
            self._sam.load_state_dict(sam_state)
