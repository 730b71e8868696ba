"""Shared flags as fairseq dataclasses: RecAdam's (``--recadam-*``), R3F's (``--eps``, ``--r3f-lambda``,
``--noise-type``), R-Drop's (``--rdrop-alpha``), the SAM family's (``--sam-type`` ...), LLRD's and ChildTuning's.
A flag exists once: every component that reads it includes the one dataclass that defines it."""

import os
from collections.abc import Collection
from dataclasses import MISSING, Field, dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ..core.anneal import ANNEAL_FUNS
from ..core.child_tuning import MODES as CHILD_TUNING_MODES
from ..core.errors import ConfigError
from ..core.r3f import NOISE_TYPES
from ..core.sam import SAM_TYPES

ANCHOR_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# How users know each core hyperparameter (command line, hydra yaml): error messages name both.
FLAG_NAMES = {
    "lr": ("--lr", "optimization.lr"), "betas": ("--adam-betas", "optimizer.adam_betas"),
    "eps": ("--adam-eps", "optimizer.adam_eps"), "weight_decay": ("--weight-decay", "optimizer.weight_decay"),
    **{k: (f"--recadam-{k.replace('_', '-')}", f"optimizer.recadam_{k}")
       for k in ("anneal_fun", "anneal_k", "anneal_t0", "anneal_w", "pretrain_cof")},
}


@dataclass
class CheckpointPaths(FairseqDataclass):
    """Where fairseq loads the weights from: read from the checkpoint node (these are fairseq's flags, not ours)."""

    restore_file: str = II("checkpoint.restore_file")
    finetune_from_model: Optional[str] = II("checkpoint.finetune_from_model")
    save_dir: str = II("checkpoint.save_dir")


@dataclass
class BestCheckpointMetric(FairseqDataclass):
    """fairseq's choice of checkpoint_best.pt, read from the checkpoint node: checked against --eval-bleu
    (criterions/bleu_check.py)."""

    best_checkpoint_metric: str = II("checkpoint.best_checkpoint_metric")
    maximize_best_checkpoint_metric: bool = II("checkpoint.maximize_best_checkpoint_metric")


def check_checkpoint_paths(cfg) -> None:
    """A --restore-file or --finetune-from-model that does not exist stops the run: fairseq would log
    "No existing checkpoint found" and train from random weights. (A config without the checkpoint
    node, e.g. a component built by hand, is not checked.)"""
    try:
        restore, finetune = cfg.restore_file, cfg.finetune_from_model
    except Exception:  # noqa: BLE001 - interpolation without a checkpoint node
        return
    if str(restore).startswith("${"):  # a bare dataclass: the interpolation was never resolved
        return
    if restore and restore != "checkpoint_last.pt" and not os.path.exists(restore):
        raise ConfigError(f"--restore-file {restore}: no such file (fairseq would train from random weights)")
    if finetune and not os.path.exists(finetune):
        raise ConfigError(f"--finetune-from-model {finetune}: no such file")


@dataclass
class RecAdamHyperparams(CheckpointPaths):
    recadam_anneal_fun: ChoiceEnum(ANNEAL_FUNS) = field(
        default="sigmoid",
        metadata={"help": "annealing schedule λ(t): sigmoid w/(1+exp(-k(t-t0))), linear min(1,t/t0)·w, constant w"},
    )
    recadam_anneal_k: float = field(
        default=0.5, metadata={"help": "slope k of the sigmoid λ(t); the authors search 0.05, 0.1, 0.2, 0.5, 1"}
    )
    recadam_anneal_t0: float = field(
        default=250, metadata={"help": "midpoint t0 (updates) of the sigmoid λ(t), or the length of the linear ramp"}
    )
    recadam_anneal_w: float = field(
        default=1.0, metadata={"help": "scale w of λ(t) for pretrained parameters; 0 gives plain Adam"}
    )
    recadam_pretrain_cof: float = field(
        default=5000.0, metadata={"help": "γ: coefficient of the quadratic penalty γ/2·Σ(θ−θ*)² toward the pretrained weights"}
    )
    recadam_pretrained_path: Optional[str] = field(
        default=None,
        metadata={"help": "fairseq checkpoint holding the pretrained weights θ*; default: the weights loaded "
                          "from --restore-file (or --finetune-from-model) when the optimizer is built"},
    )
    recadam_anchor_dtype: ChoiceEnum(list(ANCHOR_DTYPES)) = field(
        default="fp32", metadata={"help": "precision of the stored pretrained weights θ* (bf16/fp16 halve their memory)"}
    )


def check_anneal(cfg) -> None:
    """What the core's range checks let through (its defaults are the authors' class's) but a run cannot use."""
    if str(cfg.recadam_anneal_fun) == "sigmoid" and not cfg.recadam_anneal_k > 0:
        raise ConfigError(f"--recadam-anneal-k {cfg.recadam_anneal_k:g}: the sigmoid λ(t) = w/(1+exp(-k(t-t0))) "
                          f"needs k > 0 (with k = 0 it stays at w/2 for the whole run); the authors use 0.05 to 1")


@dataclass
class ForgettingMeterConfig(CheckpointPaths, BestCheckpointMetric):
    """The forgetting meter (meters/forgetting_meter.py): read by the GLUE criteria and the plug-in's optimizers
    (recadam, samsgd), so any GLUE run has it whichever of the two is fairseq's own."""

    forgetting_probe: Optional[str] = field(
        default=None,
        metadata={"help": "forgetting meter: a probe directory written by scripts/binarize_probe.py "
                          "(sentences.bin/idx, dict.txt; pairs.npz for pairs); at each validation, and once before update 1 (θ*), the "
                          "probe is measured and logged as fgt_* beside the task metrics; unset: no meter"},
    )
    forgetting_meter: ChoiceEnum(["mlm", "pairs"]) = field(
        default="mlm",
        metadata={"help": "forgetting meter: mlm, the masked-LM loss (bits) and accuracy of the model's own LM head on "
                          "the probe's sentences (fixed masking); pairs, the zero-shot sentence-pair AUC (cosine of "
                          "mean-pooled states, entailment vs contradiction), for encoders without an LM head"},
    )
    forgetting_budget: Optional[float] = field(
        default=None,
        metadata={"help": "forgetting meter: the most a validation may forget (the masked-LM loss's rise in bits, or "
                          "the pair AUC's fall, since θ*) to be checkpoint_best.pt: the meter logs fgt_budget_METRIC, "
                          "METRIC's value where the validation forgot at most this and the worst value elsewhere, for "
                          "--best-checkpoint-metric fgt_budget_METRIC (which it needs); unset: no budget"},
    )


@dataclass
class BleuStartConfig(CheckpointPaths):
    """Forgetting in BLEU (meters/bleu_start.py): read by the plug-in's seq2seq criteria. The rest are fairseq's dataset
    flags, read so θ*'s validation is batched as the Trainer's."""

    eval_bleu_start: bool = field(
        default=False,
        metadata={"help": "with --eval-bleu: each valid subset's BLEU at the pretrained weights, measured once "
                          "before update 1 through fairseq's own validation (kept in SAVE_DIR/bleu_start.json for "
                          "resuming), logged at every validation as bleu_start beside bleu, with bleu_delta = "
                          "bleu - bleu_start (negative on the original domain's subset: forgetting)"},
    )
    valid_subset: str = II("dataset.valid_subset")
    disable_validation: bool = II("dataset.disable_validation")
    max_tokens_valid: Optional[int] = II("dataset.max_tokens_valid")
    batch_size_valid: Optional[int] = II("dataset.batch_size_valid")
    skip_invalid_size_inputs_valid_test: bool = II("dataset.skip_invalid_size_inputs_valid_test")
    required_batch_size_multiple: int = II("dataset.required_batch_size_multiple")
    seed: int = II("common.seed")


@dataclass
class LayerLRHyperparams(FairseqDataclass):
    """Layer-wise learning-rate decay: read by ``--optimizer recadam`` and ``samsgd`` (optim/layer_lr.py)."""

    layer_lr_decay: float = field(
        default=1.0,
        metadata={"help": "layer-wise lr decay γ in (0, 1]: encoder layer l of L gets lr·γ^(L−l), the embeddings "
                          "lr·γ^(L+1), heads and new modules lr; 1 turns it off. fairseq's --optimizer adam does not "
                          "take it: plain Adam with it is --optimizer recadam --recadam-anneal-w 0"},
    )


@dataclass
class TrainBatches(FairseqDataclass):
    """Where the Fisher passes before update 1 (ChildTuning-D's, EWC's) take their batches: fairseq's settings."""

    train_subset: str = II("dataset.train_subset")
    max_tokens: Optional[int] = II("dataset.max_tokens")
    batch_size: Optional[int] = II("dataset.batch_size")
    required_batch_size_multiple: int = II("dataset.required_batch_size_multiple")
    num_workers: int = II("dataset.num_workers")
    seed: int = II("common.seed")


@dataclass
class ChildTuningHyperparams(TrainBatches):
    """ChildTuning (Xu et al. 2021): read by ``--optimizer recadam`` and ``samsgd`` (optim/child_tuning.py)."""

    child_tuning: ChoiceEnum(list(CHILD_TUNING_MODES)) = field(
        default="off",
        metadata={"help": "ChildTuning: F masks each gradient element of every parameter with a fresh Bernoulli(p) "
                          "per update (kept ones ×1/p); D keeps the top p fraction of the encoder layers' elements "
                          "by Fisher information of the training data, computed once before the first update; off. "
                          "Plain Adam with it is --optimizer recadam --recadam-anneal-w 0"},
    )
    child_tuning_ratio: float = field(
        default=0.3, metadata={"help": "ChildTuning: p in (0, 1], the fraction of gradient elements kept"}
    )
    child_tuning_fisher_batches: int = field(
        default=0,
        metadata={"help": "ChildTuning-D: the Fisher information sums this many training batches per rank (the "
                          "first ones of the epoch-1 order); 0: one pass over the whole training set"},
    )
    clip_norm: float = II("optimization.clip_norm")  # D's per-tensor clip of the batch gradients


FISHER_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class EWCHyperparams(TrainBatches):
    """EWC's Fisher F (core/ewc.py): read by ``--optimizer recadam`` (decoupled) and the GLUE criteria's
    ``--recadam-objective coupled``; the pull γ·(θ−θ*) becomes γ·F·(θ−θ*), F normalised to mean 1."""

    ewc_fisher: str = field(
        default="",
        metadata={"help": "EWC: weigh the pull toward θ* per element by a diagonal Fisher F: 'task' (the training "
                          "set's empirical Fisher at θ*, computed before update 1) or a file of scripts/fisher.py; "
                          "'' (default): off, F ≡ 1 (RecAdam)"},
    )
    ewc_fisher_examples: int = field(
        default=1024,
        metadata={"help": "EWC --ewc-fisher task: per-example gradients of this many training examples per rank "
                          "(the first of the epoch-1 order); 0: the whole training set"},
    )
    ewc_fisher_batch_size: int = field(
        default=16,
        metadata={"help": "EWC --ewc-fisher task: per-example gradients taken this many at a time (one vmap; memory: "
                          "one gradient of the model's size per example, and their activations); 0: one at a time (a "
                          "backward each)"},
    )
    ewc_fisher_dtype: ChoiceEnum(list(FISHER_DTYPES)) = field(
        default="fp32", metadata={"help": "EWC: precision of the stored F (bf16 halves its memory)"}
    )


@dataclass
class RecAdamObjective(FairseqDataclass):
    """Where the pull toward θ* lives: read by the GLUE criteria."""

    recadam_objective: ChoiceEnum(["decoupled", "coupled"]) = field(
        default="decoupled",
        metadata={"help": "decoupled: the target loss only, the penalty lives in --optimizer recadam; coupled: "
                          "λ(t)·Loss_T + (w−λ(t))·γ/2·Σ(θ−θ*)² in the loss, for any optimizer (e.g. adam)"},
    )


@dataclass
class SAMHyperparams(FairseqDataclass):
    """The sharpness-aware flags, shared by ``--optimizer samsgd`` and ``--optimizer recadam`` (one definition)."""

    sam_type: ChoiceEnum(list(SAM_TYPES)) = field(
        default="none",
        metadata={"help": "sharpness-aware perturbation: none, sam (Foret et al. 2021), esam (Du et al. 2022), gsam "
                          "(Zhuang et al. 2022), or fisher-{sam,esam,gsam} with FSAM's Fisher mask (Zhong et al. 2022)"},
    )
    rho: float = field(default=0.05, metadata={"help": "ρ, radius of the perturbation ε (GSAM: ρ_max, at the peak lr)"})
    beta: float = field(
        default=0.5, metadata={"help": "ESAM: probability that a parameter tensor is perturbed (ε scaled by 1/β)"}
    )
    gamma: float = field(
        default=0.5, metadata={"help": "ESAM: fraction of each batch's examples (largest loss rise under ε) used "
                                       "for the second pass"}
    )
    keep_ratio: float = field(
        default=0.1, metadata={"help": "Fisher mask: fraction of the eligible (non-bias, non-embedding) elements "
                                       "perturbed, the top ones by squared gradient"}
    )
    num_samples: int = field(
        default=32, metadata={"help": "Fisher mask: accepted for the authors' configs; the Fisher information is "
                                      "the squared gradient of the whole update's batch (all micro-batches, all ranks)"}
    )
    mask_iter_e: int = field(default=100, metadata={"help": "Fisher mask: recomputed every this many updates"})
    gsam_alpha: float = field(
        default=0.4, metadata={"help": "GSAM: α, weight of the surrogate-gap term removed from the update direction"}
    )
    rho_min: float = field(
        default=0.0, metadata={"help": "GSAM: ρ_t runs from --rho at the peak lr to this at lr 0 (proportional to lr)"}
    )


@dataclass
class R3FHyperparams(FairseqDataclass):
    """R3F's flags (fairseq's examples/rxf names). Criteria that differ only in defaults subclass this."""

    eps: float = field(
        default=1e-5, metadata={"help": "R3F noise on the token embeddings: the range (uniform) or std (normal)"}
    )
    r3f_lambda: float = field(
        default=0.0,
        metadata={"help": "R3F: weight λ of the consistency term (symmetric KL of clean and noised outputs; "
                          "for --regression-target the squared difference); 0 turns R3F off"},
    )
    noise_type: ChoiceEnum(list(NOISE_TYPES)) = field(
        default="uniform", metadata={"help": "R3F: noise distribution, U(-eps, eps) or N(0, eps^2)"}
    )


@dataclass
class RDropHyperparams(FairseqDataclass):
    """R-Drop's flag: read by the GLUE criteria and ``label_smoothed_cross_entropy_rdrop``."""

    rdrop_alpha: float = field(
        default=0.0,
        metadata={"help": "R-Drop: weight α of the consistency term between two dropout passes of each batch, the "
                          "authors' α (their loss CE1 + CE2 + α·(KL(p1‖p2) + KL(p2‖p1))/2, here over 2); for "
                          "--regression-target the squared difference; 0 turns R-Drop off"},
    )


def check_consistency_terms(cfg) -> None:
    """R-Drop and R3F are each a consistency term on a second forward of the batch: one at a time."""
    if cfg.rdrop_alpha > 0 and cfg.r3f_lambda > 0 and cfg.eps > 0:
        raise ConfigError(f"--rdrop-alpha {cfg.rdrop_alpha:g} with --r3f-lambda {cfg.r3f_lambda:g}: R-Drop and R3F "
                          f"each add a consistency term on a second forward; use one (--rdrop-alpha 0 or "
                          f"--r3f-lambda 0)")


def lr_values(cfg) -> list:
    """fairseq's --lr: a list (one value per epoch) in its config, a number in a hand-built one."""
    return list(cfg.lr) if isinstance(cfg.lr, Collection) else [cfg.lr]


def redefault(owner, name: str, default=MISSING) -> Field:
    """The flag ``name`` as dataclass ``owner`` declares it (its help; its default unless ``default``):
    for a component that takes another component's flag, or changes only its default (R3F's criteria)."""
    f = owner.__dataclass_fields__[name]
    if default is MISSING and f.default_factory is not MISSING:
        return field(default_factory=f.default_factory, metadata=dict(f.metadata))
    return field(default=f.default if default is MISSING else default, metadata=dict(f.metadata))
