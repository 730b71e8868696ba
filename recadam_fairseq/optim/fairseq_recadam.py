"""``--optimizer recadam``: the fairseq adapter around :class:`recadam_fairseq.RecAdam`.

fairseq builds the optimizer from unnamed tensors (possibly one flat fp32 copy of all of them),
so the anchor cannot be placed at construction: :class:`Anchoring` attaches θ* at the first
gradient reduction (``plumbing/events.py``), before the first step.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adam import FairseqAdamConfig
from omegaconf import II, OmegaConf

from ..core import mixout
from ..core.anchor import share_existing
from ..core.anneal import anneal_lambda
from ..core.errors import ConfigError
from ..core.recadam import RecAdam, validate_hparams
from ..core.wrappers import unwrap_model
from ..criterions import fisher_source
from .. import meters
from ..meters import theta_distance
from ..plumbing import events
from ..plumbing.anchor_source import build_anchors, pretrained_model_state
from ..plumbing.config import (ANCHOR_DTYPES, FLAG_NAMES, ChildTuningHyperparams, EWCHyperparams,
                               ForgettingMeterConfig, LayerLRHyperparams, RecAdamHyperparams, SAMHyperparams,
                               check_anneal, check_checkpoint_paths, lr_values, redefault)
from ..plumbing.events import LoopOptimizer
from ..plumbing.metrics import log_recadam_metrics
from .child_tuning import add_child_tuning
from .layer_lr import add_layer_lr
from .sam_support import add_sam

logger = logging.getLogger(__name__)


FUSED = {"auto": None, "on": True, "off": False, "cuda-graph": True}


@dataclass
class FairseqRecAdamConfig(RecAdamHyperparams, SAMHyperparams, LayerLRHyperparams, ChildTuningHyperparams,
                           EWCHyperparams, ForgettingMeterConfig):
    # fairseq's adam flags, as its FairseqAdamConfig declares them (weight decay: decoupled, applied last)
    adam_betas: Any = redefault(FairseqAdamConfig, "adam_betas", (0.9, 0.999))
    adam_eps: float = redefault(FairseqAdamConfig, "adam_eps")
    weight_decay: float = redefault(FairseqAdamConfig, "weight_decay")
    recadam_fused: ChoiceEnum(list(FUSED)) = field(
        default="auto",
        metadata={"help": "one-pass torch.compile'd update: auto (models of >= 4M elements, falling back to the "
                          "eager update if compiling fails), on (fail if it cannot compile), off (eager only), "
                          "cuda-graph (on, and on CUDA a per-tensor layout's program replayed as a CUDA graph)"},
    )
    lr: List[float] = II("optimization.lr")
    log_interval: int = II("common.log_interval")
    zero_sharding: str = II("distributed_training.zero_sharding")
    ddp_backend: str = II("distributed_training.ddp_backend")


def check_pull_stability(cfg, hp) -> None:
    """The pull p ← p − c·(p − p*), c = lr·(w−λ(t))·γ, overshoots θ* for c > 1 and diverges for c ≥ 2.

    λ(t) never decreases, so c is largest at the first step.
    """
    lr, w = max(lr_values(cfg)), hp["anneal_w"]
    c = lr * hp["pretrain_cof"] * (w - anneal_lambda(hp["anneal_fun"], 1, hp["anneal_k"], hp["anneal_t0"], w))
    if c >= 2:
        raise ConfigError(
            f"recadam: --lr {lr:g} x --recadam-pretrain-cof {hp['pretrain_cof']:g} x (w - λ(1)) = {c:g} >= 2: "
            f"the pull toward the pretrained weights overshoots them and diverges. Lower --recadam-pretrain-cof "
            f"below {2 * hp['pretrain_cof'] / c:g} (the authors use 5000 with lr 1e-5 to 2e-5)"
        )
    if c > 1:
        logger.warning(f"recadam: lr x pretrain_cof x (w - λ(1)) = {c:g} > 1: the pull overshoots θ* and oscillates")


def check_sharding(cfg) -> None:
    """--zero-sharding os works (each rank's RecAdam holds θ* of its shard). Under FSDP θ* per flat shard and
    a state layout fairscale consolidates are built and tested (optim/fsdp_support.py), but no fairseq-train
    run has checked them yet: fairscale's FSDP runs on CUDA only (scripts/gpu/run.sh fsdp)."""
    if str(cfg.ddp_backend) == "fully_sharded":
        raise ConfigError(
            "recadam does not support --ddp-backend fully_sharded: θ* per FSDP flat shard is built but not yet "
            "checked through fairseq-train against the unsharded run (fairscale's FSDP needs CUDA; docs/recadam.md, "
            "FSDP). Use --zero-sharding os (θ* and Adam's moments sharded), or --ddp-backend legacy_ddp / "
            "pytorch_ddp; --recadam-anchor-dtype bf16 halves the anchor's memory"
        )


class BoundRecAdam(RecAdam):
    """RecAdam with constructor kwargs that are no param-group hyperparameters (``bound``): under
    --zero-sharding os fairseq builds each rank's optimizer as ``type(optimizer)(shard, **optimizer_config)``,
    and those keys would land in every param group (and the checkpoint)."""

    bound = {}  # set per class by bound_recadam

    def __init__(self, params, **hp):
        super().__init__(params, **hp, **self.bound)


def bound_recadam(**kwargs) -> type:
    return type("RecAdam", (BoundRecAdam,), {"bound": kwargs, "__module__": __name__})


@register_optimizer("recadam", dataclass=FairseqRecAdamConfig)
class FairseqRecAdam(LoopOptimizer, FairseqOptimizer):
    """RecAdam for fairseq: Adam with λ(t) and a decoupled pull toward the pretrained weights.

    Like fairseq's ``adam`` this is the AdamW variant (decoupled weight decay). ``--sam-type`` adds a
    sharpness-aware gradient (``sam_support.py``); the RecAdam step is unchanged. ``--layer-lr-decay``
    scales each layer's lr (``layer_lr.py``), ``--child-tuning`` masks the gradient (``child_tuning.py``);
    with ``--recadam-anneal-w 0`` this is plain Adam with them.
    """

    def __init__(self, cfg: FairseqRecAdamConfig, params):
        super().__init__(cfg)
        hp = self.optimizer_config
        validate_hparams(hp, names=FLAG_NAMES)
        check_anneal(cfg)
        check_checkpoint_paths(cfg)
        check_pull_stability(cfg, hp)
        check_sharding(cfg)
        self._optimizer = bound_recadam(fused=FUSED[str(cfg.recadam_fused)], defer_anchors=True,
                                        cuda_graph=str(cfg.recadam_fused) == "cuda-graph")(params, **hp)
        theta_distance.optimizer_reports_it()  # recadam_dist: logged by after_step, not by the criterion
        meters.install(cfg)  # --forgetting-probe: first, so θ* is measured before SAM's first pass 1
        # the listeners, in the order of events.LISTENERS (which says why; listen() refuses another)
        add_child_tuning(self, cfg)  # --child-tuning
        fisher = add_fisher(cfg)  # --ewc-fisher: its passes see θ*, before SAM's first pass 1 moves it
        add_sam(self, cfg, seed=cfg.seed)  # --sam-type
        self.anchoring = Anchoring(self, cfg, fisher)
        self.listen("anchoring", self.anchoring)
        add_layer_lr(self, cfg)  # --layer-lr-decay: per-tensor (per-run) lr scales

    @property
    def optimizer_config(self):
        cfg = self.cfg
        betas = cfg.adam_betas
        betas = eval(betas) if isinstance(betas, str) else OmegaConf.to_container(betas) if OmegaConf.is_config(betas) else betas
        return {
            "lr": lr_values(cfg)[0],
            "betas": tuple(betas),
            "eps": cfg.adam_eps,
            "weight_decay": cfg.weight_decay,
            "anneal_fun": str(cfg.recadam_anneal_fun),  # a plain str: enums do not unpickle
            "anneal_k": cfg.recadam_anneal_k,
            "anneal_t0": cfg.recadam_anneal_t0,
            "anneal_w": cfg.recadam_anneal_w,
            "pretrain_cof": cfg.recadam_pretrain_cof,
        }

    def zero_grad(self):
        # --recadam-fused cuda-graph: a replay needs every gradient where the capture saw it, and fairseq's
        # zero_grad frees them (the next backward allocates them anew: GPU pass 5 saw no replay in fairseq-train).
        # Zeroed in place they stay put; a tensor without a gradient in a step then steps on zeros, as under --fp16.
        if str(self.cfg.recadam_fused) != "cuda-graph":
            return super().zero_grad()
        grads = [p.grad for p in self.params if p.grad is not None]  # (under --zero-sharding os too: every rank's)
        if grads:
            torch._foreach_zero_(grads)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        # every rank sees the whole state here (OSS keeps its shard's): θ* (and F) is restored, not rebuilt, on
        # every rank, also one whose shard holds no anchored tensor
        self.anchoring.restored = any("anchor" in st for st in state_dict.get("state", {}).values())
        self.anchoring.restored_fisher = any("fisher" in st for st in state_dict.get("state", {}).values())
        if self.anchoring.fisher is not None:  # F is in the state: no Fisher passes on resume
            self.anchoring.fisher.skip = self.anchoring.restored
        try:
            super().load_state_dict(state_dict, optimizer_overrides)
        except ValueError as e:  # another model size, or another layout (e.g. --fp16 vs fp32)
            if not any(s in str(e) for s in ("parameter group", "RecAdam")):  # torch's and the core's checks
                raise
            raise ConfigError(
                f"recadam: the checkpoint's optimizer state does not fit this model: {e}. Start with "
                f"--reset-optimizer (θ* then comes from --restore-file or --recadam-pretrained-path)"
            ) from e
        if self.anchoring.oss is not None:  # OSS loaded its own copy of the shard's state too; only .optim's is used
            self.anchoring.oss.state.clear()

    def step(self, closure=None, scale=1.0, groups=None):
        if not self.anchoring.bound:
            raise RuntimeError(
                "recadam: step() before all_reduce_grads(model): the anchor is bound to the "
                "model's parameter names there (fairseq's Trainer calls it before every update)"
            )
        super().step(closure, scale, groups)


def add_fisher(cfg):
    """EWC's F source for ``--ewc-fisher`` (None when off): a file is read now; ``task`` computes F at the
    criterion's first training call (before update 1; not on resume, where F is in the optimizer state)."""
    if not fisher_source.enabled(cfg):
        return None
    if cfg.recadam_anneal_w == 0:
        raise ConfigError(f"--ewc-fisher {cfg.ewc_fisher} with --recadam-anneal-w 0: plain Adam has no pull for F "
                          f"to weigh; drop one of them")
    source = fisher_source.FisherSource(cfg)
    fisher_source.optimizer_reads_it()
    if cfg.ewc_fisher == "task":
        def first_call(criterion, args):
            if not source.skip:
                source.compute(criterion, args[0])
            return None

        events.on_first_training_call(first_call)
    return source


class Anchoring:
    """θ*, attached to the optimizer's tensors at the first gradient reduction: fairseq builds the
    optimizer from unnamed tensors (possibly one flat fp32 copy of all of them), and
    ``all_reduce_grads(model)`` is the first call that shows the parameters' names. Then, on log
    steps, λ(t) and the distance to θ* in fairseq's logs."""

    def __init__(self, owner: FairseqOptimizer, cfg, fisher=None):
        self.owner, self.cfg = owner, cfg
        self.fisher = fisher  # --ewc-fisher: fisher_source.FisherSource
        self.bound = False
        self.restored = False  # load_state_dict: the checkpoint's optimizer state holds θ*
        self.restored_fisher = False  # ... and EWC's F (seen whole: under OSS a rank's shard may hold none)
        self.pretrained = None
        if cfg.recadam_pretrained_path:  # fail before training, and read the file once
            self.pretrained = pretrained_model_state(cfg.recadam_pretrained_path)

    @property
    def oss(self):
        """fairscale's OSS when fairseq shards the optimizer state (--zero-sharding os), else None."""
        o = self.owner._optimizer
        return None if isinstance(o, RecAdam) else o

    @property
    def opt(self) -> RecAdam:
        """The RecAdam of this rank: under --zero-sharding os, the one OSS built for this rank's shard."""
        return self.owner._optimizer if self.oss is None else self.oss.optim

    def before_reduce(self, model: torch.nn.Module) -> None:
        if not self.bound:
            self.bind(model)

    def bind(self, model: torch.nn.Module) -> None:
        """Attach θ* to the optimizer's tensors, by the names of ``model``'s parameters."""
        opt = self.opt
        if self.cfg.recadam_anneal_w == 0:  # plain Adam (e.g. under --layer-lr-decay): θ* would go unused
            logger.info("recadam: --recadam-anneal-w 0: plain Adam; the pretrained weights θ* are not stored")
            self.bound, self.pretrained = True, None
            return
        tensors = [p for g in opt.param_groups for p in g["params"]]
        if self.oss is not None and not {id(p) for _, p in model.named_parameters()} >= {id(t) for t in tensors}:
            raise ConfigError("recadam --zero-sharding os: θ* of fp32 master copies (--fp16-no-flatten-grads, "
                              "--bf16) is not supported yet; train in fp32 or with --memory-efficient-fp16")
        targets = mixout.targets_by_parameter(unwrap_model(model))  # --mixout: the model's own copy of θ*
        dtype = getattr(torch, ANCHOR_DTYPES[str(self.cfg.recadam_anchor_dtype)])
        if self.restored or any(opt.anchor_of(t) is not None for t in tensors):
            logger.info("recadam: pretrained weights θ* restored from the checkpoint's optimizer state")
            self._check_restored_fisher(tensors)
            if targets:
                restored = [(opt.anchor_of(t), opt.state[t].get("anchor_runs")) for t in tensors]
                unshared = mixout.held_bytes([a for a, _ in restored]) + mixout.held_bytes(targets.values())
                anchors, used, views = share_existing(tensors, restored, model, targets)
                for t, (anchor, runs) in zip(tensors, anchors):
                    if anchor is not None:
                        opt.set_anchor(t, anchor, runs)
                self._share(model, targets, used, views, unshared)
            self._log_shards()
            self.bound = True
            return
        line, anchors, plan = build_anchors(tensors, model, self.cfg, self.pretrained, dtype, shared=targets)
        for t, anchor, runs in anchors:
            opt.set_anchor(t, anchor, runs)
        if self.fisher is not None:  # F in the anchor's layout: per tensor, or the flat tensor's runs
            if self.fisher.computed:  # no update yet: the weights are those the passes saw
                fisher_source.check_at_theta_star(fisher_source.pieces(anchors), self.fisher.where)
            # normalised over every anchored element, kept for this rank's tensors (its shard under OSS)
            f = self.fisher.normalised(model, plan.anchored, keep={n for parts in plan.parts for n, _, _ in parts})
            for t, fisher, _ in plan.build(f, dtype=fisher_source.fisher_dtype(self.cfg)):
                if fisher is not None:
                    opt.set_fisher(t, fisher)
        self.pretrained = None  # the anchor holds what is needed; free the mapping
        logger.info(f"recadam: {line}")
        if targets:
            itemsize = torch.empty(0, dtype=dtype).element_size()
            unshared = sum(plan.numel[n] for n in plan.anchored) * itemsize + mixout.held_bytes(targets.values())
            self._share(model, targets, plan.shared, plan.views, unshared)
        self._log_shards()
        self.bound = True

    def _check_restored_fisher(self, tensors) -> None:
        """A resumed run keeps the checkpoint's F (bit for bit); the flag must say EWC as the run did."""
        has = self.restored_fisher or any(self.opt.fisher_of(t) is not None for t in tensors)
        if self.fisher is not None and not has:
            raise ConfigError(f"--ewc-fisher {self.cfg.ewc_fisher}: the checkpoint's optimizer state has no F (it was "
                              f"trained without --ewc-fisher): resume without it, or start a new optimizer state with "
                              f"--reset-optimizer")
        if self.fisher is None and has:
            raise ConfigError("the checkpoint's optimizer state holds EWC's F (trained with --ewc-fisher): resume with "
                              "the same --ewc-fisher, or start a new optimizer state with --reset-optimizer")
        if has:
            logger.info("ewc: F restored from the checkpoint's optimizer state")

    def _log_shards(self) -> None:
        """--zero-sharding os: the elements of θ* (and EWC's F) each rank holds (rank 0 logs them all)."""
        if self.oss is None:
            return
        tensors = [p for g in self.opt.param_groups for p in g["params"]]
        mine = [sum(x.numel() for x in map(get, tensors) if x is not None) for get in (self.opt.anchor_of,
                                                                                       self.opt.fisher_of)]
        held = [None] * self.oss.world_size
        torch.distributed.all_gather_object(held, mine, group=self.oss.group)
        anchors, fishers = zip(*held)
        shown = [("recadam: --zero-sharding os: θ*", anchors)] + ([("ewc: --zero-sharding os: F", fishers)]
                                                                  if any(fishers) else [])
        for what, counts in shown:
            logger.info(f"{what} elements held per rank: {', '.join(f'{n:,}' for n in counts)} (of {sum(counts):,})")

    def _reduce(self, x, op):
        """A number summed (or maxed) over the ranks of the sharded optimizer, in float64."""
        x = torch.as_tensor(x, dtype=torch.float64).to(self.oss._default_device).reshape(1)
        torch.distributed.all_reduce(x, op=op, group=self.oss.group)
        return x[0]

    def _share(self, model, targets, used, views, unshared: int) -> None:
        """--mixout: the model's targets are θ* (anchors ``used``; ``views``: pieces of the anchor that
        become the targets); log what anchor and targets hold together, and what they would apart."""
        for name, piece in views.items():
            mixout.set_target(unwrap_model(model), name, piece)
        targets = mixout.targets_by_parameter(unwrap_model(model))
        anchors = [self.opt.anchor_of(p) for g in self.opt.param_groups for p in g["params"]]
        held = mixout.held_bytes([*anchors, *targets.values()])
        how = []
        if used:
            how.append(f"{len(used)} anchors are the model's targets")
        if views:
            how.append(f"{len(views)} targets are pieces of the {str(next(iter(views.values())).dtype)[6:]} anchor")
        logger.info(f"recadam: --mixout: θ* stored once for {len(used) + len(views)} of {len(targets)} mixout weights"
                    f"{' (' + ', '.join(how) + ')' if how else ''}; anchor + targets hold {held:,} bytes ({unshared:,} "
                    f"as two copies)")

    def after_step(self) -> None:
        """λ(t) and the distance to θ*, on log steps only: the distance costs a pass over the weights.

        Every rank holds the same weights and anchor: each logs the same value (no sum over ranks).
        Under --zero-sharding os each rank holds a shard (perhaps without an anchored tensor): t is
        the ranks' largest, the distance their sum.
        """
        opt, cfg = self.opt, self.cfg
        t = opt.anchored_step()
        if self.oss is not None:
            t = int(self._reduce(t, torch.distributed.ReduceOp.MAX))
        if t and t % max(1, int(cfg.log_interval)) == 0:
            if self.oss is None:
                lam, dist = opt.current_lambda(), opt.anchor_distance().item()
            else:
                lam = anneal_lambda(str(cfg.recadam_anneal_fun), t, cfg.recadam_anneal_k, cfg.recadam_anneal_t0,
                                    cfg.recadam_anneal_w)
                dist = self._reduce(opt.anchor_distance(), torch.distributed.ReduceOp.SUM).item()
            log_recadam_metrics(lam, dist, 0.5 * cfg.recadam_pretrain_cof * dist)
