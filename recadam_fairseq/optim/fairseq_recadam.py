"""``--optimizer recadam``: the fairseq adapter around :class:`recadam_fairseq.RecAdam`.

fairseq builds the optimizer from unnamed tensors (possibly one flat fp32 copy of all of them),
so the anchor cannot be placed at construction. fairseq's Trainer calls
``optimizer.all_reduce_grads(model)`` before every update, forwarded through its fp16 wrappers:
on the first call we learn the parameter names, decide which tensors are pretrained and attach
θ* to them, before the first step.
"""

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from ..anchor import AnchorError, AnchorPlan, load_checkpoint, pretrained_names, recadam_updates
from ..config import ANCHOR_DTYPES, FLAG_NAMES, RecAdamHyperparams
from ..recadam import RecAdam, validate_hparams

logger = logging.getLogger(__name__)


@dataclass
class FairseqRecAdamConfig(RecAdamHyperparams):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(
        default=0.0, metadata={"help": "decoupled weight decay, applied after the RecAdam update"}
    )
    lr: List[float] = II("optimization.lr")


def restore_path(cfg) -> str:
    """The checkpoint fairseq loads model weights from (its own rule in checkpoint_utils)."""
    if cfg.restore_file == "checkpoint_last.pt":
        last = os.path.join(cfg.save_dir, "checkpoint_last.pt")
        if not os.path.exists(last) and cfg.finetune_from_model:
            return cfg.finetune_from_model
        return last
    return cfg.restore_file


def check_pull_stability(cfg, h) -> None:
    """The pull p ← p − c·(p − p*), c = lr·(w−λ)·γ, overshoots θ* for c > 1 and diverges for c ≥ 2."""
    lrs = cfg.lr if isinstance(cfg.lr, Collection) else [cfg.lr]
    c = max(lrs) * h["anneal_w"] * h["pretrain_cof"]
    if c >= 2:
        raise ValueError(
            f"recadam: --lr {max(lrs):g} x --recadam-pretrain-cof {h['pretrain_cof']:g} x --recadam-anneal-w "
            f"{h['anneal_w']:g} = {c:g} >= 2: the pull toward the pretrained weights overshoots them and "
            f"diverges. Lower --recadam-pretrain-cof below {2 / (max(lrs) * h['anneal_w']):g} (the authors "
            f"use 5000 with lr 1e-5 to 2e-5)"
        )
    if c > 1:
        logger.warning(f"recadam: lr x pretrain_cof x anneal_w = {c:g} > 1: the pull overshoots θ* and oscillates")


@register_optimizer("recadam", dataclass=FairseqRecAdamConfig)
class FairseqRecAdam(FairseqOptimizer):
    """RecAdam for fairseq: Adam with λ(t) and a decoupled pull toward the pretrained weights.

    Like fairseq's ``adam`` this is the AdamW variant (decoupled weight decay).
    """

    def __init__(self, cfg: FairseqRecAdamConfig, params):
        super().__init__(cfg)
        h = self.optimizer_config
        validate_hparams(h, names=FLAG_NAMES)
        check_pull_stability(cfg, h)
        self._bound = False
        self._pretrained = None
        if cfg.recadam_pretrained_path:  # fail before training, and read the file once
            try:
                self._pretrained = load_checkpoint(cfg.recadam_pretrained_path)["model"]
            except AnchorError as e:
                raise AnchorError(f"--recadam-pretrained-path {e}") from None
        self._optimizer = RecAdam(params, **h, defer_anchors=True)

    @property
    def optimizer_config(self):
        cfg = self.cfg
        betas = cfg.adam_betas
        betas = eval(betas) if isinstance(betas, str) else OmegaConf.to_container(betas) if OmegaConf.is_config(betas) else betas
        return {
            "lr": cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr,
            "betas": tuple(betas),
            "eps": cfg.adam_eps,
            "weight_decay": cfg.weight_decay,
            "anneal_fun": str(cfg.recadam_anneal_fun),  # a plain str: enums do not unpickle
            "anneal_k": cfg.recadam_anneal_k,
            "anneal_t0": cfg.recadam_anneal_t0,
            "anneal_w": cfg.recadam_anneal_w,
            "pretrain_cof": cfg.recadam_pretrain_cof,
        }

    # ------------------------------------------------------------- binding the anchor
    def all_reduce_grads(self, module):
        if not self._bound:
            self.bind(module)
        super().all_reduce_grads(module)

    def bind(self, model: torch.nn.Module) -> None:
        """Attach θ* to the optimizer's tensors, by the names of ``model``'s parameters."""
        opt = self._optimizer
        tensors = [p for g in opt.param_groups for p in g["params"]]
        if any(opt.anchor_of(t) is not None for t in tensors):
            logger.info("recadam: pretrained weights θ* restored from the checkpoint's optimizer state")
            self._bound = True
            return
        cfg = self.cfg
        if self._pretrained is not None:
            source, state = f"--recadam-pretrained-path {cfg.recadam_pretrained_path}", self._pretrained
        else:
            path = restore_path(cfg)
            if not os.path.exists(path):
                raise AnchorError(
                    f"recadam has no pretrained weights to pull toward: no checkpoint was loaded "
                    f"({path} does not exist). Give the pretrained model with --restore-file "
                    f"(or --finetune-from-model), or --recadam-pretrained-path"
                )
            try:
                ckpt = load_checkpoint(path)
            except AnchorError as e:
                raise AnchorError(f"--restore-file {e}") from None
            source, state = f"--restore-file {path}", ckpt["model"]
            done = recadam_updates(ckpt)
            if done:  # --reset-optimizer on a fine-tuned checkpoint: the user asked for it, but say so
                logger.warning(
                    f"recadam: !!! {path} was written by recadam after {done} updates and the optimizer "
                    f"state was reset: θ* is now these FINE-TUNED weights, not the pretrained ones. To keep "
                    f"pulling toward the pretrained model, pass --recadam-pretrained-path PRETRAINED.pt !!!"
                )
        try:
            plan = AnchorPlan(tensors, model, pretrained_names(model, state))
        except AnchorError as e:
            raise AnchorError(f"{source}: {e}") from None
        values = None if self._pretrained is None else pretrained_names(model, state)
        dtype = getattr(torch, ANCHOR_DTYPES[str(cfg.recadam_anchor_dtype)])
        for t, anchor, runs in plan.build(values, dtype=dtype):
            opt.set_anchor(t, anchor, runs)
        self._pretrained = None  # the anchor holds what is needed; free the mapping
        logger.info(f"recadam: pretrained weights θ* from {source}: {plan.summary()}")
        self._bound = True

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        try:
            super().load_state_dict(state_dict, optimizer_overrides)
        except ValueError as e:  # another model size, or another layout (e.g. --fp16 vs fp32)
            raise ValueError(
                f"recadam: the checkpoint's optimizer state does not fit this model: {e}. Start with "
                f"--reset-optimizer (θ* then comes from --restore-file or --recadam-pretrained-path)"
            ) from e

    def step(self, closure=None, scale=1.0, groups=None):
        if not self._bound:
            raise RuntimeError(
                "recadam: step() before all_reduce_grads(model): the anchor is bound to the "
                "model's parameter names there (fairseq's Trainer calls it before every update)"
            )
        super().step(closure, scale, groups)
