"""``--optimizer recadam``: the fairseq adapter around :class:`recadam_fairseq.RecAdam`.

fairseq builds the optimizer from unnamed tensors (possibly one flat fp32 copy of all of them),
so the anchor cannot be placed at construction. fairseq's Trainer calls
``optimizer.all_reduce_grads(model)`` before every update, forwarded through its fp16 wrappers:
on the first call we learn the parameter names, decide which tensors are pretrained and attach
θ* to them, before the first step.
"""

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from ..anchor import build_anchors, pretrained_model_state
from ..anneal import anneal_lambda
from ..core.errors import ConfigError
from ..config import (ANCHOR_DTYPES, FLAG_NAMES, RecAdamHyperparams, SAMHyperparams, check_anneal,
                      check_checkpoint_paths)
from ..recadam import RecAdam, validate_hparams
from ..report import log_recadam_metrics
from .sam_mixin import SAMOptimizerMixin

logger = logging.getLogger(__name__)


FUSED = {"auto": None, "on": True, "off": False}


@dataclass
class FairseqRecAdamConfig(RecAdamHyperparams, SAMHyperparams):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(
        default=0.0, metadata={"help": "decoupled weight decay, applied after the RecAdam update"}
    )
    recadam_fused: ChoiceEnum(list(FUSED)) = field(
        default="auto",
        metadata={"help": "one-pass torch.compile'd update: auto (models of >= 4M elements, falling back to the "
                          "eager update if compiling fails), on (fail if it cannot compile), off (eager only)"},
    )
    lr: List[float] = II("optimization.lr")
    log_interval: int = II("common.log_interval")
    zero_sharding: str = II("distributed_training.zero_sharding")
    ddp_backend: str = II("distributed_training.ddp_backend")
    seed: int = II("common.seed")


def check_pull_stability(cfg, h) -> None:
    """The pull p ← p − c·(p − p*), c = lr·(w−λ(t))·γ, overshoots θ* for c > 1 and diverges for c ≥ 2.

    λ(t) never decreases, so c is largest at the first step.
    """
    lrs = cfg.lr if isinstance(cfg.lr, Collection) else [cfg.lr]
    lr, w = max(lrs), h["anneal_w"]
    c = lr * h["pretrain_cof"] * (w - anneal_lambda(h["anneal_fun"], 1, h["anneal_k"], h["anneal_t0"], w))
    if c >= 2:
        raise ConfigError(
            f"recadam: --lr {lr:g} x --recadam-pretrain-cof {h['pretrain_cof']:g} x (w - λ(1)) = {c:g} >= 2: "
            f"the pull toward the pretrained weights overshoots them and diverges. Lower --recadam-pretrain-cof "
            f"below {2 * h['pretrain_cof'] / c:g} (the authors use 5000 with lr 1e-5 to 2e-5)"
        )
    if c > 1:
        logger.warning(f"recadam: lr x pretrain_cof x (w - λ(1)) = {c:g} > 1: the pull overshoots θ* and oscillates")


def check_sharding(cfg) -> None:
    """Sharded optimizer state would need the anchor sharded with it: not supported (yet)."""
    for flag, used in (("--zero-sharding os", str(cfg.zero_sharding) == "os"),
                       ("--ddp-backend fully_sharded", str(cfg.ddp_backend) == "fully_sharded")):
        if used:
            raise ConfigError(
                f"recadam does not support {flag}: the pretrained anchor would have to be sharded like the "
                f"optimizer state it belongs to. Use --ddp-backend pytorch_ddp (GPUs), legacy_ddp or no_c10d; "
                f"--recadam-anchor-dtype bf16 halves the anchor's memory"
            )


@register_optimizer("recadam", dataclass=FairseqRecAdamConfig)
class FairseqRecAdam(SAMOptimizerMixin, FairseqOptimizer):
    """RecAdam for fairseq: Adam with λ(t) and a decoupled pull toward the pretrained weights.

    Like fairseq's ``adam`` this is the AdamW variant (decoupled weight decay). ``--sam-type`` adds a
    sharpness-aware gradient (:mod:`.sam_hook`); the RecAdam step is unchanged.
    """

    def __init__(self, cfg: FairseqRecAdamConfig, params):
        super().__init__(cfg)
        h = self.optimizer_config
        validate_hparams(h, names=FLAG_NAMES)
        check_anneal(cfg)
        check_checkpoint_paths(cfg)
        check_pull_stability(cfg, h)
        check_sharding(cfg)
        self._bound = False
        self._pretrained = None
        if cfg.recadam_pretrained_path:  # fail before training, and read the file once
            self._pretrained = pretrained_model_state(cfg.recadam_pretrained_path)
        self._optimizer = RecAdam(params, **h, fused=FUSED[str(cfg.recadam_fused)], defer_anchors=True)
        self.init_sam(cfg, seed=cfg.seed)

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
        if getattr(self, "_sam", None) is not None:
            self._sam.pert.restore()  # bind may read the model's weights: θ, not θ + ε
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
        dtype = getattr(torch, ANCHOR_DTYPES[str(self.cfg.recadam_anchor_dtype)])
        line, anchors = build_anchors(tensors, model, self.cfg, self._pretrained, dtype)
        for t, anchor, runs in anchors:
            opt.set_anchor(t, anchor, runs)
        self._pretrained = None  # the anchor holds what is needed; free the mapping
        logger.info(f"recadam: {line}")
        self._bound = True

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        try:
            super().load_state_dict(state_dict, optimizer_overrides)
        except ValueError as e:  # another model size, or another layout (e.g. --fp16 vs fp32)
            raise ConfigError(
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
        t = self._optimizer.anchored_step()
        if t and t % max(1, int(self.cfg.log_interval)) == 0:
            self.log_metrics()

    def log_metrics(self) -> None:
        """λ(t) and the distance to θ*, on log steps only: the distance costs a pass over the weights.

        Every rank holds the same weights and anchor: each logs the same value (no sum over ranks).
        """
        dist = self._optimizer.anchor_distance().item()
        log_recadam_metrics(self._optimizer.current_lambda(), dist, 0.5 * self.cfg.recadam_pretrain_cof * dist)
