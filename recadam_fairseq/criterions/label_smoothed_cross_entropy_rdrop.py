"""``--criterion label_smoothed_cross_entropy_rdrop``: R-Drop for sequence-to-sequence (translation, BART).

As the authors' ``reg_label_smoothed_cross_entropy``: the batch and its copy in one forward of 2B rows
(each copy its own dropout draws), fairseq's label-smoothed cross-entropy of both passes, and the
symmetric KL of the two passes' output distributions over the target positions that are not padding,
with the weight α/2 (their ½·(KL(p‖q) + KL(q‖p))). Beyond theirs: the loss is theirs over 2 (the mean of
the passes' cross-entropies, ``core/rdrop.rdrop_loss``), the sample size follows ``--sentence-avg``, the
logged ``nll_loss`` is the mean of the passes' (theirs sums both), the term is logged as ``symm_kl``
(R3F's metric), ``--ignore-prefix-size`` and ``--report-accuracy`` apply, and α is checked at start.
Validation, and α = 0, is fairseq's ``label_smoothed_cross_entropy``.
"""

from dataclasses import dataclass

import torch
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..core import r3f, rdrop
from ..meters import InstallsWhenTraining
from ..plumbing.config import BestCheckpointMetric, BleuStartConfig, RDropHyperparams, redefault
from .bleu_check import check_bleu
from .r3f_term import reduce_symm_kl


@dataclass
class LabelSmoothedCrossEntropyRDropConfig(LabelSmoothedCrossEntropyCriterionConfig, RDropHyperparams,
                                           BestCheckpointMetric, BleuStartConfig):
    rdrop_alpha: float = redefault(RDropHyperparams, "rdrop_alpha", 5.0)  # the authors' translation recipe


@register_criterion("label_smoothed_cross_entropy_rdrop", dataclass=LabelSmoothedCrossEntropyRDropConfig)
class LabelSmoothedCrossEntropyRDropCriterion(InstallsWhenTraining, LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, rdrop_alpha, ignore_prefix_size=0,
                 report_accuracy=False, best_checkpoint_metric=None, maximize_best_checkpoint_metric=None, cfg=None):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        rdrop.check_rdrop_alpha(rdrop_alpha)
        check_bleu(task, best_checkpoint_metric, maximize_best_checkpoint_metric)
        self.rdrop_alpha = rdrop_alpha
        self.meters_cfg = cfg  # --eval-bleu-start (meters/bleu_start.py)

    def forward(self, model, sample, reduce=True):
        if not (self.rdrop_alpha > 0 and model.training):
            return super().forward(model, sample, reduce=reduce)
        net_output = model(**rdrop.twice(sample["net_input"]))
        target = sample["target"]
        both_loss, both_nll = self.compute_loss(model, net_output, {**sample, "target": torch.cat([target, target])})
        logits = net_output[0]
        if self.ignore_prefix_size > 0:
            logits, target = logits[:, self.ignore_prefix_size:], target[:, self.ignore_prefix_size:]
        first, second = logits.chunk(2)
        term = r3f.symm_kl_sum(first, second, target.eq(self.padding_idx))
        loss = rdrop.rdrop_loss(both_loss, term, self.rdrop_alpha)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data, "nll_loss": 0.5 * both_nll.data, "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0), "sample_size": sample_size, "symm_kl": term.data,
        }
        if self.report_accuracy:  # the first pass
            n_correct, total = self.compute_accuracy(model, (net_output[0].chunk(2)[0], *net_output[1:]), sample)
            logging_output.update(n_correct=utils.item(n_correct.data), total=utils.item(total.data))
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        reduce_symm_kl(logging_outputs)
