"""What ``--sam-type`` adds to a plug-in optimizer (``samsgd``, ``recadam``): the SAM controller
(``core/sam_controller.py``), connected to fairseq's training loop through ``plumbing/events.py``.

The optimizer's own events (before/after the gradient reduction, after the step, its checkpoint
state under ``last_optimizer_state["sam"]``) reach the controller as a listener of the optimizer;
the criterion's (before/after each training forward) through per-instance hooks added when the
criterion first trains.
"""

import dataclasses
import logging
from typing import Optional

import torch

from ..core.errors import ConfigError
from ..core.sam import validate_sam_hparams
from ..core.sam_controller import SAMController, subset
from ..criterions.glue_core import criterion_name, per_example_loss_of
from ..plumbing import events
from ..plumbing.config import SAMHyperparams, lr_values
from ..plumbing.metrics import log_sam_metrics

logger = logging.getLogger(__name__)

STATE_KEY = "sam"  # the controller's state inside the optimizer's state dict (checkpoint_last.pt)
SAM_KEYS = tuple(f.name for f in dataclasses.fields(SAMHyperparams))


def sam_hparams(cfg) -> dict:
    return {k: (str(getattr(cfg, k)) if k == "sam_type" else getattr(cfg, k)) for k in SAM_KEYS}


def add_sam(optimizer: events.LoopOptimizer, cfg, seed: int = 1) -> Optional[SAMController]:
    """The controller for ``cfg``'s ``--sam-type`` as a listener of ``optimizer``, or None (none, or ρ = 0)."""
    hp = sam_hparams(cfg)
    validate_sam_hparams(hp)
    if hp["sam_type"] == "none":
        return None
    if str(getattr(cfg, "zero_sharding", "none")) == "os":  # not yet checked against the unsharded run
        raise ConfigError(f"--sam-type {hp['sam_type']} does not support --zero-sharding os yet: drop one of them")
    if hp["rho"] == 0:  # ε = 0: the second pass would compute ∇L(θ) again
        logger.warning(f"--sam-type {hp['sam_type']} with --rho 0: ε is 0, so no second pass is run "
                       f"(the base optimizer's update alone)")
        return None
    controller = SAMController(hp, optimizer.get_lr, max(lr_values(cfg)), seed=seed, log=log_sam_metrics)
    optimizer.listen(STATE_KEY, controller)
    connect(controller)
    return controller


def connect(controller: SAMController) -> None:
    """Meet the criterion and the model at the criterion's first training call; follow its forwards from then on."""

    def first_call(criterion, args):
        per_example = per_example_loss_of(criterion)
        if controller.base == "esam" and (per_example is None or getattr(criterion, "handles_multitask", False)):
            raise ConfigError(
                f"--sam-type {controller.sam_type}: ESAM's data selection needs one loss per example, which the "
                f"single-task sentence_prediction criteria give (fairseq's sentence_prediction, "
                f"sentence_prediction_recadam, sentence_prediction_r3f); --criterion {criterion_name(criterion)} "
                f"does not. Use --sam-type sam/gsam/fisher-sam/fisher-gsam")
        controller.attach(args[0], per_example, events.loss_scale, select_examples)
        events.forward_hooks(criterion, controller.before_forward, controller.after_forward)
        logger.info(f"sam: {controller.sam_type} on {len(controller.params)} parameter tensors via a forward "
                    f"pre-hook on {type(criterion).__name__}")
        return controller.before_forward(criterion, args)

    events.on_first_training_call(first_call)


def select_examples(sample: dict, idx: torch.Tensor, n: int) -> dict:
    """ESAM's examples ``idx`` of a fairseq sample of ``n``, with the counts fairseq's criteria read
    (``nsentences``; ``ntokens`` from the source lengths) those of the examples kept."""
    chosen = subset(sample, idx, n)
    chosen["nsentences"] = idx.numel()
    lengths = chosen.get("net_input", {}).get("src_lengths")
    if torch.is_tensor(lengths) and "ntokens" in chosen:
        chosen["ntokens"] = int(lengths.sum())
    return chosen
