"""``--criterion glue_multitask``: the loss and GLUE dev metrics of ``--task glue_multitask``.

A batch may mix tasks: one encoder forward (with per-example ``task_ids`` for a task-conditioned
model), then each task's examples through that task's head, cross-entropy (classification) or
squared error (STS-B) summed over the batch. Logged per task (``<head>`` = the task's head name,
e.g. ``cola``, ``sst_2``, ``sts_b``): ``<head>_loss``, ``<head>_accuracy`` and on validation its
GLUE metrics over the whole dev set -- ``<head>_mcc``, ``<head>_f1``, ``<head>_acc_and_f1``,
``<head>_pearson``, ``<head>_spearman`` -- and ``glue_avg``, the mean of every task's primary
metric (CoLA mcc, MRPC/QQP f1, STS-B pearson, the others accuracy), usable as
``--best-checkpoint-metric glue_avg``. Everything logged sums over batches and workers (confusion
matrices; STS-B predictions scattered into a vector as long as the dev set), so distributed
validation works on CPU too. MT-Uncertainty's extra forward passes are logged as ``mt_extra_fwd``
(passes per update) and ``mt_scored`` (examples scored per update).

``--recadam-objective coupled`` works as with ``sentence_prediction_recadam`` (one penalty per batch).
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.logging import metrics
from fairseq.logging.meters import safe_round

from .. import glue_metrics
from ..core.errors import ConfigError
from ..core.glue_tasks import HEAD_TO_TASK, primary_metric
from ..report import RECADAM_METRICS, log_recadam_metrics
from .sentence_prediction_recadam import (SentencePredictionRecAdamConfig, SentencePredictionRecAdamCriterion,
                                          _label_values, _log_total)



@register_criterion("glue_multitask", dataclass=SentencePredictionRecAdamConfig)
class GlueMultitaskCriterion(SentencePredictionRecAdamCriterion):
    handles_multitask = True

    def __init__(self, cfg, task):
        super().__init__(cfg, task)
        if not hasattr(task, "mt_task_names"):
            raise ConfigError("--criterion glue_multitask needs --task glue_multitask")
        if cfg.regression_target:
            raise ConfigError("--regression-target does not apply to --criterion glue_multitask: "
                             "each task's labels.json says whether it is a regression (STS-B)")
        if self.r3f:  # the inherited R3F term would use one head; a batch here mixes tasks
            raise ConfigError(f"--r3f-lambda {cfg.r3f_lambda}: R3F is not available with --criterion glue_multitask "
                             f"(its consistency term is per head and a batch mixes tasks); use --r3f-lambda 0")
        self.heads = task.head_names
        self.label_orders = [None if task.regression[t] else _label_values(task.label_dictionary_of(t), k)
                             for t, k in enumerate(task.num_classes)]

    def forward(self, model, sample, reduce=True):
        task = self.task
        features = task.forward_features(model, sample)
        task_ids, target = sample["task_ids"], sample["target"]
        sample_size = int(task_ids.numel())
        log = {"ntokens": sample["ntokens"], "nsentences": sample_size, "sample_size": sample_size}
        total = features.new_zeros((), dtype=torch.float32)
        groups = {t: (pos, logits) for t, pos, logits in task.head_logits(model, features, task_ids)}
        for t, h in enumerate(self.heads):
            pos, logits = groups.get(t, (None, None))
            n = 0 if pos is None else len(pos)
            if task.regression[t]:
                if n:
                    pred, y = logits.view(-1).float(), target[pos].float()
                    loss_t = F.mse_loss(pred, y, reduction="sum")
                else:
                    loss_t = total.new_zeros(())
            else:
                if n:
                    y = target[pos].long()
                    lp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
                    loss_t = F.nll_loss(lp, y, reduction="sum")
                    pred = logits.detach().argmax(-1)
                    log[f"{h}_ncorrect"] = (pred == y).sum()
                else:
                    loss_t = total.new_zeros(())
                    # a tensor like the other ranks' (fairseq all-reduces numbers and tensors apart)
                    log[f"{h}_ncorrect"] = torch.zeros((), dtype=torch.long, device=features.device)
            total = total + loss_t
            log[f"{h}_loss"] = loss_t.detach()
            log[f"{h}_n"] = n
            if not model.training:  # whole-dev-set statistics, summable; the same keys and shapes for
                log.update(self._dev_stats(t, h, pos, logits, target, sample))  # every batch and rank
        if model.training and "mt_scored" in sample:  # MT-Uncertainty: one extra forward over the candidates
            log["mt_scored"] = sample["mt_scored"]
            log["mt_extra_fwd"] = 1
        log["target_loss"] = total.detach()
        loss = total
        if self.coupled and model.training:
            loss = self._coupled_loss(model, total, sample_size, log)
        log["loss"] = loss.detach()
        return loss, sample_size, log

    def _dev_stats(self, t, h, pos, logits, target, sample):
        if self.task.regression[t]:
            # prediction, target and count at the example's index in its dev set; the vector is as
            # long as the task's largest loaded split, a size every rank agrees on (and that also
            # fits the training batch fairseq substitutes on a rank whose shard ran out)
            size = max(int(ds.lengths[t]) for ds in self.task.datasets.values() if hasattr(ds, "lengths"))
            reg = torch.zeros(3, size, dtype=torch.float64)
            if pos is not None and len(pos):
                at = sample["task_index"][pos].cpu()
                reg[0].index_add_(0, at, logits.detach().view(-1).double().cpu())
                reg[1].index_add_(0, at, target[pos].detach().double().cpu())
                reg[2].index_add_(0, at, torch.ones(len(at), dtype=torch.float64))
            return {f"{h}_reg": reg}
        k = self.task.num_classes[t]
        cm = torch.zeros(k, k, dtype=torch.long)
        if pos is not None and len(pos):
            pred, targ = logits.detach().argmax(-1).cpu(), target[pos].detach().long().cpu()
            order = self.label_orders[t]
            if order is not None:  # rows/columns = label values ("0", "1"): f1's positive class is "1"
                pred, targ = order[pred], order[targ]
            cm = torch.bincount(targ * k + pred, minlength=k * k).view(k, k)
        return {f"{h}_cm": cm}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        metrics.log_scalar("loss", float(total("loss")) / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("target_loss", float(total("target_loss")) / max(sample_size, 1) / math.log(2),
                           sample_size, round=3)
        count = total("recadam_count")
        if count:
            log_recadam_metrics(**{k: total(k) / count for k in RECADAM_METRICS})
        keys = set().union(*[log.keys() for log in logging_outputs]) if logging_outputs else set()
        if "mt_scored" in keys:
            metrics.log_scalar("mt_scored", float(total("mt_scored")), round=1)
            metrics.log_scalar("mt_extra_fwd", float(total("mt_extra_fwd")), round=1)
        heads = sorted(k[:-2] for k in keys if k.endswith("_n") and k[:-2] in HEAD_TO_TASK)
        dev = []
        for h in heads:
            n = float(total(f"{h}_n"))
            if n > 0:
                metrics.log_scalar(f"{h}_loss", float(total(f"{h}_loss")) / n / math.log(2), n, round=3)
                if f"{h}_ncorrect" in keys:
                    metrics.log_scalar(f"{h}_accuracy", 100.0 * float(total(f"{h}_ncorrect")) / n, n, round=2)
            cms = [log[f"{h}_cm"] for log in logging_outputs if f"{h}_cm" in log]
            if cms and n > 0:  # (n = 0: the task has no dev set in this subset, e.g. CoLA in MNLI's valid1)
                _log_total(f"_{h}_cm", sum(cm.cpu().double() for cm in cms))
                metrics.log_derived(f"{h}_mcc", _derived(h, "mcc"))
                if cms[0].shape[0] == 2:
                    metrics.log_derived(f"{h}_f1", _derived(h, "f1"))
                    metrics.log_derived(f"{h}_acc_and_f1", _derived(h, "acc_and_f1"))
                dev.append(h)
            regs = [log[f"{h}_reg"] for log in logging_outputs if f"{h}_reg" in log]
            if regs and n > 0:
                _log_total(f"_{h}_reg", sum(r.cpu().double() for r in regs))
                for m in ("pearson", "spearman"):
                    metrics.log_derived(f"{h}_{m}", _derived(h, m))
                dev.append(h)
        if dev:  # (fairseq keeps the first function registered: it must find the tasks by itself)
            metrics.log_derived("glue_avg", glue_avg)

    def logging_outputs_can_be_summed(self) -> bool:
        return True  # every entry is a number or a fixed-shape tensor


def dev_metric(meters, h, name):
    """A GLUE metric of task head ``h`` (x100) from the totals of one validation pass."""
    if f"_{h}_reg" in meters:
        reg = meters[f"_{h}_reg"].total.numpy()
        seen = reg[2] > 0
        pred, targ = reg[0][seen] / reg[2][seen], reg[1][seen] / reg[2][seen]
        fn = {"pearson": glue_metrics.pearson, "spearman": glue_metrics.spearman}[name]
        return 100.0 * fn(pred, targ)
    cm = meters[f"_{h}_cm"].total.numpy()
    fns = {"accuracy": glue_metrics.accuracy_from_confusion, "mcc": glue_metrics.mcc_from_confusion,
           "f1": glue_metrics.f1_from_confusion,
           "acc_and_f1": glue_metrics.acc_and_f1_from_confusion}
    return 100.0 * fns[name](cm)


def glue_avg(meters):
    """Mean primary metric of the tasks that had dev examples in this validation."""
    heads = [h for h in HEAD_TO_TASK if f"_{h}_cm" in meters or f"_{h}_reg" in meters]
    return safe_round(float(np.mean([dev_metric(meters, h, primary_metric(HEAD_TO_TASK[h])) for h in heads])), 2)


def _derived(h, name):
    return lambda meters: safe_round(dev_metric(meters, h, name), 2)
