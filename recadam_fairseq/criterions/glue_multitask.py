"""``--criterion glue_multitask``: the loss and GLUE dev metrics of ``--task glue_multitask``.

A batch may mix tasks: one encoder forward (with per-example ``task_ids`` for a task-conditioned
model), then each task's examples through that task's head, the GLUE criterion core's loss
(``glue_core.py``: cross-entropy, or squared error for STS-B) summed over the batch. Logged per
task (``<head>`` = the task's head name, e.g. ``cola``, ``sst_2``, ``sts_b``): ``<head>_loss``,
``<head>_accuracy`` and on validation its GLUE metrics over the whole dev set (``<head>_mcc``,
``<head>_f1``, ``<head>_acc_and_f1``, ``<head>_pearson``, ``<head>_spearman``, ...) and ``glue_avg``,
the mean of every task's primary metric (``core/glue_tasks.py``; a user's own task: accuracy, or
pearson for a regression; beside it, mcc, or spearman and pearson_and_spearman), usable as
``--best-checkpoint-metric glue_avg``. Everything logged sums over batches and workers, so
distributed validation works on CPU too. MT-Uncertainty's extra forward passes are logged as
``mt_extra_fwd`` (passes per update) and ``mt_scored`` (examples scored per update).

``--recadam-objective coupled`` adds the coupled RecAdam term (``coupled_term.py``, one per batch).
"""

import math

import numpy as np
import torch
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.logging import metrics
from fairseq.logging.meters import safe_round

from ..core import r3f, rdrop
from ..core.errors import ConfigError
from ..core.glue_tasks import HEAD_TO_TASK, head_primary_metric
from ..meters import theta_distance
from ..plumbing.config import check_anneal
from ..plumbing.metrics import log_target_loss
from . import coupled_term, glue_core
from .sentence_prediction_recadam import SentencePredictionRecAdamConfig


@register_criterion("glue_multitask", dataclass=SentencePredictionRecAdamConfig)
class GlueMultitaskCriterion(glue_core.ChecksPathsWhenTraining, FairseqCriterion):
    handles_multitask = True

    def __init__(self, cfg, task):
        super().__init__(task)
        self.cfg = cfg
        if not hasattr(task, "mt_task_names"):
            raise ConfigError("--criterion glue_multitask needs --task glue_multitask")
        if cfg.regression_target:
            raise ConfigError("--regression-target does not apply to --criterion glue_multitask: "
                              "each task's labels.json says whether it is a regression (STS-B)")
        r3f.check_hyperparams(cfg.eps, cfg.r3f_lambda, str(cfg.noise_type))
        if cfg.r3f_lambda > 0 and cfg.eps > 0:  # the consistency term is per head; a batch mixes tasks
            raise ConfigError(f"--r3f-lambda {cfg.r3f_lambda}: R3F is not available with --criterion glue_multitask "
                              f"(its consistency term is per head and a batch mixes tasks); use --r3f-lambda 0")
        rdrop.check_rdrop_alpha(cfg.rdrop_alpha)
        if cfg.rdrop_alpha > 0:
            raise ConfigError(f"--rdrop-alpha {cfg.rdrop_alpha}: R-Drop is not available with --criterion "
                              f"glue_multitask (its consistency term is per head and a batch mixes tasks); use "
                              f"--rdrop-alpha 0")
        self.coupled = None
        if str(cfg.recadam_objective) == "coupled":
            check_anneal(cfg)
            self.coupled = coupled_term.CoupledObjective(cfg, self)
        self.heads = task.head_names
        self.label_orders = [None if task.regression[t] else glue_core.label_values(task.label_dictionary_of(t), k)
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
            regression = task.regression[t]
            y = None
            if n:
                y = target[pos].float() if regression else target[pos].long()
                loss_t = glue_core.summed_loss(logits, y, regression)
            else:
                loss_t = total.new_zeros(())
            if not regression:  # a tensor like the other ranks' (fairseq all-reduces numbers and tensors apart)
                log[f"{h}_ncorrect"] = ((logits.detach().argmax(-1) == y).sum() if n
                                        else torch.zeros((), dtype=torch.long, device=features.device))
            total = total + loss_t
            log[f"{h}_loss"] = loss_t.detach()
            log[f"{h}_n"] = n
            if not model.training:  # whole-dev-set statistics: the same keys and shapes for every batch and rank
                log.update(glue_core.dev_stats(
                    logits if n else None, y if n else target[:0], regression, task.num_classes[t], self.label_orders[t],
                    index=sample["task_index"][pos] if n else None, size=self._task_size(t), prefix=f"{h}_"))
        if model.training and "mt_scored" in sample:  # MT-Uncertainty: one extra forward over the candidates
            log["mt_scored"] = sample["mt_scored"]
            log["mt_extra_fwd"] = 1
        log["target_loss"] = total.detach()
        loss = total
        if self.coupled is not None and model.training:
            loss = self.coupled(model, total, sample_size, log)
        log["loss"] = loss.detach()
        return loss, sample_size, log

    def per_example_loss(self, model, sample):
        """One loss per example in the batch's order (their sum is forward's task loss): EWC's task Fisher."""
        features = self.task.forward_features(model, sample)
        target, out = sample["target"], None
        for t, pos, logits in self.task.head_logits(model, features, sample["task_ids"]):
            y = target[pos].float() if self.task.regression[t] else target[pos].long()
            losses = glue_core.example_losses(logits, y, self.task.regression[t])
            out = (losses.new_zeros(len(target)) if out is None else out).index_put((pos,), losses)
        return out

    def _task_size(self, t: int) -> int:
        """Task t's largest loaded split: a regression vector every batch and rank agrees on (and that also
        fits the training batch fairseq substitutes on a rank whose shard ran out)."""
        return max(int(ds.lengths[t]) for ds in self.task.datasets.values() if hasattr(ds, "lengths"))

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        metrics.log_scalar("loss", float(total("loss")) / max(sample_size, 1) / math.log(2), sample_size, round=3)
        log_target_loss(logging_outputs)
        coupled_term.reduce(logging_outputs)
        theta_distance.reduce(logging_outputs)
        keys = set().union(*[log.keys() for log in logging_outputs]) if logging_outputs else set()
        if "mt_scored" in keys:
            metrics.log_scalar("mt_scored", float(total("mt_scored")), round=1)
            metrics.log_scalar("mt_extra_fwd", float(total("mt_extra_fwd")), round=1)
        heads = sorted(k[:-2] for k in keys if k.endswith("_n") and f"{k[:-2]}_loss" in keys)
        dev = False
        for h in heads:
            n = float(total(f"{h}_n"))
            if n > 0:
                metrics.log_scalar(f"{h}_loss", float(total(f"{h}_loss")) / n / math.log(2), n, round=3)
                if f"{h}_ncorrect" in keys:
                    metrics.log_scalar(f"{h}_accuracy", 100.0 * float(total(f"{h}_ncorrect")) / n, n, round=2)
                # (n = 0: the task has no dev set in this subset, e.g. CoLA in MNLI's valid1)
                # a user's task: its labels' order is its own, so no F1 of "class 1"
                names = None if h in HEAD_TO_TASK else glue_core.LABEL_FREE_METRICS
                dev = glue_core.reduce_dev(logging_outputs, prefix=f"{h}_", names=names) or dev
        if dev:  # (fairseq keeps the first function registered: it must find the tasks by itself)
            metrics.log_derived("glue_avg", glue_avg)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True  # every entry is a number or a fixed-shape tensor


def glue_avg(meters):
    """Mean primary metric of the tasks that had dev examples in this validation (their ``_<head>_cm`` /
    ``_<head>_reg`` totals)."""
    heads = {k[1:-len(end)]: end == "_reg" for k in meters for end in ("_cm", "_reg")
             if k.startswith("_") and k.endswith(end) and len(k) > len(end) + 1}
    return safe_round(float(np.mean([glue_core.dev_metric(meters, f"{h}_", head_primary_metric(h, reg))
                                     for h, reg in heads.items()])), 2)
