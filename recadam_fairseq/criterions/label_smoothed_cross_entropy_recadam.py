"""``--criterion label_smoothed_cross_entropy_recadam``: the RecAdam paper's coupled objective for
sequence-to-sequence models (translation, BART), with any optimizer.

fairseq's label-smoothed cross-entropy (R-Drop's term too where ``--rdrop-alpha`` > 0: this is
``label_smoothed_cross_entropy_rdrop`` with α off by default) as Loss_T, and with
``--recadam-objective coupled`` the loss λ(t)·Loss_T + (w−λ(t))·γ/2·Σ F·(θ−θ*)² of
``coupled_term.py``, F ≡ 1 unless ``--ewc-fisher`` gives one (EWC: a file, or ``task``, whose per-example loss
is each target sentence's negative log-likelihood, ``fisher_source.seq2seq_per_example``). ``decoupled``, the default, leaves the pull to
``--optimizer recadam``: then this is fairseq's criterion (with R-Drop's term where α > 0).
"""

from dataclasses import dataclass

from fairseq.criterions import register_criterion

from ..plumbing.config import EWCHyperparams, RecAdamHyperparams, RecAdamObjective, check_anneal, redefault
from ..plumbing.metrics import log_target_loss
from . import coupled_term
from .label_smoothed_cross_entropy_rdrop import LabelSmoothedCrossEntropyRDropConfig, LabelSmoothedCrossEntropyRDropCriterion


@dataclass
class LabelSmoothedCrossEntropyRecAdamConfig(LabelSmoothedCrossEntropyRDropConfig, RecAdamHyperparams,
                                             RecAdamObjective, EWCHyperparams):
    rdrop_alpha: float = redefault(LabelSmoothedCrossEntropyRDropConfig, "rdrop_alpha", 0.0)


@register_criterion("label_smoothed_cross_entropy_recadam", dataclass=LabelSmoothedCrossEntropyRecAdamConfig)
class LabelSmoothedCrossEntropyRecAdamCriterion(LabelSmoothedCrossEntropyRDropCriterion):
    def __init__(self, cfg: LabelSmoothedCrossEntropyRecAdamConfig, task):
        super().__init__(task, cfg.sentence_avg, cfg.label_smoothing, cfg.rdrop_alpha, cfg.ignore_prefix_size,
                         cfg.report_accuracy, cfg.best_checkpoint_metric, cfg.maximize_best_checkpoint_metric, cfg)
        self.cfg = cfg
        self.coupled = None
        if str(cfg.recadam_objective) == "coupled":
            check_anneal(cfg)
            self.coupled = coupled_term.CoupledObjective(cfg, self)

    def train(self, mode: bool = True):
        if mode:
            coupled_term.check_fisher_is_read(self)
        return super().train(mode)

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        if self.coupled is not None and model.training:
            logging_output["target_loss"] = loss.data  # Loss_T (with R-Drop's term), beside the coupled loss
            loss = self.coupled(model, loss, sample_size, logging_output)
            logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if any("target_loss" in log for log in logging_outputs):  # training with the coupled objective
            log_target_loss(logging_outputs)
        coupled_term.reduce(logging_outputs)
