"""``--criterion sentence_prediction_recadam``: fairseq's sentence_prediction + GLUE dev metrics + terms.

- fairseq's ``sentence_prediction`` (classification, ``--regression-target``, ``--classification-head-name``:
  its own config), through the GLUE criterion core (``glue_core.py``).
- The GLUE dev metrics over the whole valid set, usable as ``--best-checkpoint-metric``: accuracy,
  mcc (CoLA), f1 and acc_and_f1 (MRPC, QQP), pearson, spearman and pearson_and_spearman (STS-B);
  ``target_loss`` (the task loss alone) beside fairseq's ``loss``.
- Terms added to the loss, each in its own file: the consistency term of R3F (``--r3f-lambda`` > 0) or of
  R-Drop (``--rdrop-alpha`` > 0: two dropout passes, the task loss of both), ``r3f_term.py``, ``rdrop_term.py``;
  ``sentence_prediction_r3f`` / ``sentence_prediction_rdrop`` turn one on by default; and the paper's coupled
  RecAdam objective (``--recadam-objective coupled``, ``coupled_term.py``). The default,
  ``decoupled``, leaves the penalty to ``--optimizer recadam``; over another optimizer (fairseq's adam) the
  criterion logs ``recadam_dist`` itself (``meters/theta_distance.py``).
"""

from dataclasses import dataclass

from omegaconf import II

from fairseq.criterions import register_criterion
from fairseq.criterions.fairseq_criterion import FairseqCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.tasks.translation import TranslationTask

from ..core import r3f, rdrop
from ..core.errors import ConfigError
from ..meters import theta_distance
from ..plumbing.config import (EWCHyperparams, ForgettingMeterConfig, R3FHyperparams, RDropHyperparams,
                               RecAdamHyperparams, RecAdamObjective, check_anneal, check_consistency_terms, redefault)
from ..plumbing.metrics import log_target_loss
from . import coupled_term, glue_core, r3f_term, rdrop_term
from .label_check import check_labels


@dataclass
class SentencePredictionRecAdamConfig(RecAdamHyperparams, RecAdamObjective, R3FHyperparams, RDropHyperparams,
                                      EWCHyperparams, ForgettingMeterConfig):
    # fairseq's sentence_prediction flags, as its SentencePredictionConfig declares them
    classification_head_name: str = redefault(SentencePredictionConfig, "classification_head_name")
    regression_target: bool = redefault(SentencePredictionConfig, "regression_target")
    log_interval: int = II("common.log_interval")  # meters/theta_distance.py: recadam_dist on log steps


@register_criterion("sentence_prediction_recadam", dataclass=SentencePredictionRecAdamConfig)
class SentencePredictionRecAdamCriterion(glue_core.ChecksPathsWhenTraining, SentencePredictionCriterion):
    NAME = "sentence_prediction_recadam"

    def __init__(self, cfg: SentencePredictionRecAdamConfig, task):
        if isinstance(task, TranslationTask):  # else: no classification head, found at the first training call
            raise ConfigError(f"--criterion {self.NAME} is a sentence-classification (GLUE) criterion; on --task "
                              f"translation use label_smoothed_cross_entropy_{self.NAME.rsplit('_', 1)[1]}")
        FairseqCriterion.__init__(self, task)  # the parent's __init__ differs between fairseq releases
        self.cfg = cfg
        self.classification_head_name = cfg.classification_head_name
        self.regression_target = cfg.regression_target
        r3f.check_hyperparams(cfg.eps, cfg.r3f_lambda, str(cfg.noise_type))
        self.r3f = cfg.r3f_lambda > 0 and cfg.eps > 0  # off: no noise draw, no second forward
        rdrop.check_rdrop_alpha(cfg.rdrop_alpha)
        check_consistency_terms(cfg)
        self.rdrop = cfg.rdrop_alpha > 0  # off: one pass, the batch as it is
        self.coupled = None
        if str(cfg.recadam_objective) == "coupled":
            check_anneal(cfg)
            self.coupled = coupled_term.CoupledObjective(cfg, self)
        check_labels(task)
        self._model_checked = False
        self._label_orders = {}  # number of classes -> label id to label value

    def train(self, mode: bool = True):
        if mode:
            coupled_term.check_fisher_is_read(self)
        return super().train(mode)

    def per_example_loss(self, model, sample):
        """One loss per example (ESAM's selection): the task loss without the terms."""
        return glue_core.per_example_loss(model, sample, self.classification_head_name, self.regression_target)

    def _check_model(self, model):
        """Once, at the first training forward (criteria are built before they see the model)."""
        heads = getattr(model, "classification_heads", None)
        if heads is None or self.classification_head_name not in heads:
            raise ConfigError(
                f"--classification-head-name {self.classification_head_name}: the model has no such head "
                f"(it has: {', '.join(heads) if heads else 'no classification heads'}); "
                f"--criterion {self.NAME} needs a RoBERTa-style model with that head")
        if self.r3f and r3f_term.embed_tokens(model) is None:
            raise ConfigError(f"--r3f-lambda {self.cfg.r3f_lambda}: R3F noises the token embeddings, and this model "
                              f"({type(model).__name__}) has no encoder.sentence_encoder.embed_tokens")
        self._model_checked = True

    def forward(self, model, sample, reduce=True):
        if not self._model_checked and model.training:
            self._check_model(model)
        head, cfg = self.classification_head_name, self.cfg
        term = both = None
        if self.r3f and model.training:  # the term first: the order autograd sums the clean logits' gradients in
            logits, term = r3f_term.clean_and_consistency(model, sample["net_input"], head, cfg.eps,
                                                          str(cfg.noise_type), self.regression_target)
        elif self.rdrop and model.training:  # both passes' logits (2B rows); accuracy counts the first pass
            both, term = rdrop_term.two_passes_and_consistency(model, sample["net_input"], head, self.regression_target)
            logits = both[:len(both) // 2]
        else:
            logits = glue_core.head_logits(model, sample["net_input"], head)
        targets = glue_core.targets_of(model, sample, logits)
        sample_size = targets.numel()
        if both is None:
            task_loss = glue_core.summed_loss(logits, targets, self.regression_target)
        else:  # R-Drop: the task loss is the mean of the two passes' (core/rdrop.rdrop_loss)
            both_loss = glue_core.summed_loss(both, targets.repeat(2), self.regression_target)
            task_loss = 0.5 * both_loss
        loss = task_loss
        logging_output = {"target_loss": task_loss.data, "ntokens": sample["ntokens"], "nsentences": sample_size,
                          "sample_size": sample_size}
        if term is not None:  # summed over the batch (sum/batch·size): one value per update in reduce
            term = term * sample_size
            loss = loss + cfg.r3f_lambda * term if both is None else rdrop.rdrop_loss(both_loss, term, cfg.rdrop_alpha)
            logging_output["symm_kl"] = term.data
        if not self.regression_target:
            logging_output["ncorrect"] = (logits.argmax(dim=1) == targets).sum()
        if self.coupled is not None and model.training:
            loss = self.coupled(model, loss, sample_size, logging_output)  # Loss_T: with the R3F/R-Drop term
        if not model.training:  # the GLUE metrics need the whole valid set
            k = logits.size(-1)
            if k not in self._label_orders and not self.regression_target:
                self._label_orders[k] = glue_core.label_values(getattr(self.task, "label_dictionary", None), k)
            order = self._label_orders.get(k)
            logging_output.update(glue_core.dev_stats(
                logits, targets, self.regression_target, k, order, index=sample.get("id"),
                size=glue_core.dataset_size(self.task) if self.regression_target else 0))
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        SentencePredictionCriterion.reduce_metrics(logging_outputs)  # loss, nll_loss, accuracy
        log_target_loss(logging_outputs)
        r3f_term.reduce_symm_kl(logging_outputs)
        coupled_term.reduce(logging_outputs)
        theta_distance.reduce(logging_outputs)
        glue_core.reduce_dev(logging_outputs)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        """Every entry is a number or a fixed-shape tensor (λ and the distance are divided by their count)."""
        return True
