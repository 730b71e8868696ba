"""One criterion core for GLUE-style heads, single-task and multi-task: the loss, what a batch logs,
and the GLUE dev metrics over a whole validation, once.

- :func:`head_logits` / :func:`per_example_loss` / :func:`summed_loss`: fairseq's ``sentence_prediction``
  loss (cross-entropy over the classes, or squared error for a regression head such as STS-B's),
  summed over the batch or one value per example (ESAM's selection reads those).
- :func:`dev_stats`: a validation batch's summable statistics: a confusion matrix (rows and columns
  are label values, so the F1 of MRPC/QQP is the label named "1"), or for a regression the
  predictions and targets scattered at the examples' indices into vectors as long as the largest
  split. Both sum across batches and workers, so distributed validation works on CPU too.
- :func:`reduce_dev`: the metrics over the whole validation (mcc, f1, acc_and_f1; pearson, spearman,
  pearson_and_spearman), computed in numpy (``core/glue_metrics.py``), under a key prefix
  (``""`` single-task, ``"<head>_"`` multi-task).
"""

import torch
import torch.nn.functional as F
from fairseq.criterions.sentence_prediction import SentencePredictionCriterion
from fairseq.logging import metrics
from fairseq.logging.meters import MetersDict, safe_round

from ..core import glue_metrics
from ..core.errors import ConfigError
from .. import meters
from ..plumbing.config import check_checkpoint_paths

CLASSIFICATION_METRICS = {"mcc": glue_metrics.mcc_from_confusion, "f1": glue_metrics.f1_from_confusion,
                          "acc_and_f1": glue_metrics.acc_and_f1_from_confusion,
                          "accuracy": glue_metrics.accuracy_from_confusion}
REGRESSION_METRICS = {"pearson": glue_metrics.pearson, "spearman": glue_metrics.spearman,
                      "pearson_and_spearman": lambda p, t: (glue_metrics.pearson(p, t) + glue_metrics.spearman(p, t)) / 2}
# Metrics that do not depend on which label is "1" (a user's own task; accuracy is logged per batch)
LABEL_FREE_METRICS = {"cm": ("mcc",), "reg": tuple(REGRESSION_METRICS)}


class ChecksPathsWhenTraining:
    """Mixed into the GLUE criteria: ``--restore-file`` / ``--finetune-from-model`` are checked, and the meters
    installed (``meters.install``: the forgetting meter of ``--forgetting-probe``, and the distance to θ* that
    these criteria log where the optimizer and the objective log none), when fairseq's Trainer first puts the
    criterion in training mode, before the first update and outside the step's crash handler. fairseq-validate,
    which rebuilds criteria from a checkpoint whose files may be long gone, never does."""

    def train(self, mode: bool = True):
        if mode and not getattr(self, "_paths_checked", False):
            check_checkpoint_paths(self.cfg)
            meters.install(self.cfg, self.task, criterion=self)
            self._paths_checked = True
        return super().train(mode)


# --------------------------------------------------------------------------- loss
def head_logits(model, net_input, head: str, **kwargs) -> torch.Tensor:
    logits, _ = model(**net_input, features_only=True, classification_head_name=head, **kwargs)
    return logits


def targets_of(model, sample, logits) -> torch.Tensor:
    return model.get_targets(sample, [logits]).view(-1)


def summed_loss(logits, targets, regression: bool) -> torch.Tensor:
    """fairseq's sentence_prediction loss, summed over the batch, in fp32."""
    if regression:
        return F.mse_loss(logits.view(-1).float(), targets.float(), reduction="sum")
    return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum")


def per_example_loss(model, sample, head: str, regression: bool) -> torch.Tensor:
    """The same loss, one value per example (their sum is the criterion's), in at least fp32."""
    logits = head_logits(model, sample["net_input"], head)
    return example_losses(logits, targets_of(model, sample, logits), regression)


def example_losses(logits, targets, regression: bool) -> torch.Tensor:
    """:func:`summed_loss` without the sum: one value per row of ``logits``, in at least fp32."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    if regression:
        return F.mse_loss(logits.view(-1).to(dt), targets.to(dt), reduction="none")
    return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=dt), targets, reduction="none")


def per_example_loss_of(criterion):
    """``f(model, sample)`` giving one loss per example for this criterion, or None (it cannot say).

    Criteria of the plug-in that can say define ``per_example_loss``; fairseq's own single-task
    ``sentence_prediction`` gets the core's function with its head."""
    own = getattr(criterion, "per_example_loss", None)
    if own is not None:
        return own
    if type(criterion) is SentencePredictionCriterion:
        return lambda model, sample: per_example_loss(model, sample, criterion.classification_head_name,
                                                      criterion.regression_target)
    return None


def criterion_name(criterion) -> str:
    """The --criterion name fairseq registered the criterion's class under (its class name if none): what a
    one-line error about a criterion (no per-example loss, above) names."""
    from fairseq.criterions import CRITERION_REGISTRY

    return next((n for n, c in CRITERION_REGISTRY.items() if c is type(criterion)), type(criterion).__name__)


# --------------------------------------------------------------------------- what a batch logs
def label_values(label_dict, k: int):
    """Label id -> the integer its label names (GLUE's "0"/"1"), or None unless they are 0..k-1."""
    if label_dict is None or len(label_dict) < label_dict.nspecial + k:
        return None
    names = [label_dict[label_dict.nspecial + i] for i in range(k)]
    try:
        values = [int(n) for n in names]
    except ValueError:
        return None
    return torch.tensor(values) if sorted(values) == list(range(len(values))) else None


def dev_stats(logits, targets, regression: bool, num_classes: int, label_order=None, index=None, size: int = 0,
              prefix: str = "") -> dict:
    """``{prefix}cm``: the k x k confusion matrix [target, prediction] in label values; or for a
    regression ``{prefix}reg``: [prediction, target, count] at each example's ``index``, length ``size``.
    ``logits`` may be None (no example of this head in the batch): zeros of the same shape, as every
    rank and batch must log the same keys and shapes."""
    if regression:
        reg = torch.zeros(3, size, dtype=torch.float64)
        if logits is not None and len(targets):
            if index is None:
                raise ConfigError("a regression head's dev metrics need the examples' indices (sample['id'], as "
                                  "fairseq's sentence_prediction task gives them)")
            at = index.cpu()
            keep = at < size  # (a rank whose shard ran out validates fairseq's zeroed dummy batch)
            at = at[keep]
            reg[0].index_add_(0, at, logits.detach().view(-1).double().cpu()[keep])
            reg[1].index_add_(0, at, targets.detach().double().cpu()[keep])
            reg[2].index_add_(0, at, torch.ones(len(at), dtype=torch.float64))
        return {f"{prefix}reg": reg}
    k = num_classes
    if logits is None or not len(targets):
        return {f"{prefix}cm": torch.zeros(k, k, dtype=torch.long)}
    pred, targ = logits.detach().argmax(-1).cpu(), targets.detach().long().cpu()
    if label_order is not None:  # label ids follow the dictionary's frequency order
        pred, targ = label_order[pred], label_order[targ]
    return {f"{prefix}cm": torch.bincount(targ * k + pred, minlength=k * k).view(k, k)}


def dataset_size(task) -> int:
    """The length of the task's largest loaded split: a regression vector every batch and rank agrees on."""
    sizes = [len(ds) for ds in getattr(task, "datasets", {}).values()]
    return max(sizes) if sizes else 0


# --------------------------------------------------------------------------- whole-validation metrics
class TotalMeter(MetersDict._DerivedMeter):
    """The sum of what one validation logs under a key: the GLUE metrics need the whole set.

    A _DerivedMeter to fairseq, so checkpoints do not save it (fairseq could not rebuild a meter
    class of ours on resume); keys starting with "_" are never printed."""

    def __init__(self):
        super().__init__(lambda meters: None)
        self.total = None

    def update(self, value):
        self.total = value if self.total is None else self.total + value


def log_total(key, value) -> None:
    for agg in metrics.get_active_aggregators():
        if key not in agg:
            agg.add_meter(key, TotalMeter(), 1000)
        agg[key].update(value)


def reduce_dev(logging_outputs, prefix: str = "", names=None) -> bool:
    """Totals and derived GLUE metrics of a validation's ``{prefix}cm`` / ``{prefix}reg``; True if any.
    ``names``: {"cm": ..., "reg": ...}, the metrics to derive (default: GLUE's)."""
    cms = [log[f"{prefix}cm"] for log in logging_outputs if f"{prefix}cm" in log]
    regs = [log[f"{prefix}reg"] for log in logging_outputs if f"{prefix}reg" in log]
    if cms:
        log_total(f"_{prefix}cm", sum(cm.cpu().double() for cm in cms))
        default = ("mcc", "f1", "acc_and_f1") if cms[0].shape[0] == 2 else ("mcc",)
        names = names["cm"] if names else default
    elif regs:
        log_total(f"_{prefix}reg", sum(r.cpu().double() for r in regs))
        names = names["reg"] if names else tuple(REGRESSION_METRICS)
    else:
        return False
    for name in names:
        metrics.log_derived(f"{prefix}{name}", lambda meters, name=name: safe_round(dev_metric(meters, prefix, name), 2))
    return True


def dev_metric(meters, prefix: str, name: str) -> float:
    """A GLUE metric (x100) from the totals of one validation."""
    if f"_{prefix}reg" in meters:
        reg = meters[f"_{prefix}reg"].total.numpy()
        seen = reg[2] > 0
        pred, targ = reg[0][seen] / reg[2][seen], reg[1][seen] / reg[2][seen]
        return 100.0 * REGRESSION_METRICS[name](pred, targ)
    return 100.0 * CLASSIFICATION_METRICS[name](meters[f"_{prefix}cm"].total.numpy())
