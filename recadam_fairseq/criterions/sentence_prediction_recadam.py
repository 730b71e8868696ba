"""``--criterion sentence_prediction_recadam``: sentence_prediction, GLUE dev metrics, RecAdam's objective.

- What fairseq's ``sentence_prediction`` does (classification, ``--regression-target``, head name).
- GLUE dev metrics over the whole valid set, usable as ``--best-checkpoint-metric``: accuracy,
  mcc (CoLA), f1 and acc_and_f1 (MRPC, QQP), pearson, spearman and pearson_and_spearman (STS-B).
- ``target_loss`` logged apart from the penalty, for plots of Loss = λ(t)·Loss_T + (1−λ(t))·Loss_S.
- ``--recadam-objective decoupled`` (default): the loss is the target loss; the penalty lives in
  ``--optimizer recadam``. ``coupled``: the loss is λ(t)·Loss_T + (w−λ(t))·γ/2·Σ(θ−θ*)², for any
  optimizer (the paper's baseline: RecAdam's decoupling is what it improves on). The anchor and
  λ(t) come from the same code as the optimizer's (anchor.py, anneal.py).
- R3F (``--r3f-lambda`` > 0, ``--eps``, ``--noise-type``; off by default here): a second forward on
  noised token embeddings and λ·symm_kl added to the target loss (r3f.py). ``sentence_prediction_r3f``
  is this criterion with fairseq's R3F defaults (λ 1.0): a drop-in for fairseq's examples/rxf, except that
  the noise reaches a stock RoBERTa encoder here (fairseq 0.12's RobertaEncoder drops token_embeddings).
"""

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.criterions.fairseq_criterion import FairseqCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionCriterion
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from fairseq.logging.meters import MetersDict, safe_round
from fairseq.models.roberta.model import RobertaEncoder

from .. import glue_metrics, r3f
from ..anchor import build_anchors
from ..core.errors import ConfigError
from ..anneal import anneal_lambda
from ..config import R3FHyperparams, RecAdamHyperparams, check_anneal, check_checkpoint_paths
from ..report import RECADAM_METRICS, log_recadam_metrics
from .label_check import check_labels

logger = logging.getLogger(__name__)

OBJECTIVES = ChoiceEnum(["decoupled", "coupled"])


@dataclass
class SentencePredictionRecAdamConfig(RecAdamHyperparams, R3FHyperparams):
    classification_head_name: str = field(
        default="sentence_classification_head", metadata={"help": "name of the classification head to use"}
    )
    regression_target: bool = field(default=False, metadata={"help": "regression (STS-B) instead of classification"})
    recadam_objective: OBJECTIVES = field(
        default="decoupled",
        metadata={"help": "decoupled: the target loss only, the penalty lives in --optimizer recadam; coupled: "
                          "λ(t)·Loss_T + (w−λ(t))·γ/2·Σ(θ−θ*)² in the loss, for any optimizer (e.g. adam)"},
    )


class _SumMeter(MetersDict._DerivedMeter):
    """The sum (tensors) or concatenation (lists) of what one validation pass logs: the GLUE metrics
    need the whole set, not a per-batch average.

    A _DerivedMeter to fairseq, so checkpoints do not save it (fairseq could not rebuild a meter
    class of ours on resume); keys starting with "_" are never printed.
    """

    def __init__(self):
        super().__init__(lambda meters: None)
        self.total = None

    def update(self, value):
        self.total = value if self.total is None else self.total + value


def _log_total(key, value):
    for agg in metrics.get_active_aggregators():
        if key not in agg:
            agg.add_meter(key, _SumMeter(), 1000)
        agg[key].update(value)


@register_criterion("sentence_prediction_recadam", dataclass=SentencePredictionRecAdamConfig)
class SentencePredictionRecAdamCriterion(SentencePredictionCriterion):
    NAME = "sentence_prediction_recadam"

    def __init__(self, cfg: SentencePredictionRecAdamConfig, task):
        FairseqCriterion.__init__(self, task)  # the parent's __init__ differs between fairseq releases
        self.cfg = cfg
        self.classification_head_name = cfg.classification_head_name
        self.regression_target = cfg.regression_target
        self.coupled = str(cfg.recadam_objective) == "coupled"
        r3f.check_hyperparams(cfg.eps, cfg.r3f_lambda, str(cfg.noise_type))
        check_checkpoint_paths(cfg)
        if self.coupled:
            check_anneal(cfg)
        if not getattr(self, "handles_multitask", False):
            check_labels(task)
        self.r3f = cfg.r3f_lambda > 0 and cfg.eps > 0  # off: no noise draw, no second forward
        self._model_checked = False
        self.num_updates = 0
        self._anchors = None
        self._label_dict = getattr(task, "label_dictionary", None)
        if self.coupled:
            self._follow_updates(task)

    def _follow_updates(self, task):
        """λ(t) needs the update number; fairseq hands it to task.train_step, not to criteria."""
        train_step = task.train_step

        def _train_step(*args, **kwargs):
            self.num_updates = kwargs["update_num"] if "update_num" in kwargs else args[4]
            return train_step(*args, **kwargs)

        task.train_step = _train_step

    # ----------------------------------------------------------------- forward
    def _check_model(self, model):
        """Once, at the first forward (criteria are built before they see the model)."""
        heads = getattr(model, "classification_heads", None)
        if heads is None or self.classification_head_name not in heads:
            raise ConfigError(
                f"--classification-head-name {self.classification_head_name}: the model has no such head "
                f"(it has: {', '.join(heads) if heads else 'no classification heads'}); "
                f"--criterion {self.NAME} needs a RoBERTa-style model with that head")
        if self.r3f and self._embed_tokens(model) is None:
            raise ConfigError(f"--r3f-lambda {self.cfg.r3f_lambda}: R3F noises the token embeddings, and this model "
                             f"({type(model).__name__}) has no encoder.sentence_encoder.embed_tokens")
        self._model_checked = True

    @staticmethod
    def _embed_tokens(model):
        return getattr(getattr(getattr(model, "encoder", None), "sentence_encoder", None), "embed_tokens", None)

    def _logits_from_embeddings(self, model, net_input, embeddings):
        """The head's output on ``embeddings`` as the encoder's token embeddings. fairseq 0.12's
        RobertaEncoder.forward drops a ``token_embeddings`` kwarg (it calls extract_features without it),
        so model(..., token_embeddings=x) on a stock roberta_* runs the clean tokens: call what
        RobertaModel.forward would, with the embeddings given. Encoders with their own forward
        (which may pass them through, as ca_mtl_roberta's does) are called through the model."""
        head = self.classification_head_name
        encoder = getattr(model, "encoder", None)
        if isinstance(encoder, RobertaEncoder) and type(encoder).forward is RobertaEncoder.forward:
            features, _ = encoder.extract_features(net_input["src_tokens"], token_embeddings=embeddings)
            return model.classification_heads[head](features)
        logits, _ = model(**net_input, features_only=True, classification_head_name=head,
                          token_embeddings=embeddings)
        return logits

    def forward(self, model, sample, reduce=True):
        if not self._model_checked:
            self._check_model(model)
        head = self.classification_head_name
        term = None
        if self.r3f and model.training:
            # fairseq's order: clean forward (dropout draws), noise, noised forward, then the consistency
            # term before the task loss (the order autograd sums the clean logits' gradients in)
            embeddings = self._embed_tokens(model)(sample["net_input"]["src_tokens"])
            logits = self._logits_from_embeddings(model, sample["net_input"], embeddings)
            noise = r3f.sample_noise(embeddings.shape, self.cfg.eps, str(self.cfg.noise_type))
            noised_logits = self._logits_from_embeddings(model, sample["net_input"],
                                                         r3f.add_noise(embeddings, noise))
            consistency = r3f.regression_consistency if self.regression_target else r3f.symm_kl
            term = consistency(noised_logits, logits)
        else:
            logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=head)
        targets = model.get_targets(sample, [logits]).view(-1)
        sample_size = targets.numel()
        if self.regression_target:
            logits = logits.view(-1).float()
            targets = targets.float()
            task_loss = F.mse_loss(logits, targets, reduction="sum")
        else:
            lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            task_loss = F.nll_loss(lprobs, targets, reduction="sum")
        loss = task_loss
        logging_output = {
            "target_loss": task_loss.data, "ntokens": sample["ntokens"],
            "nsentences": sample_size, "sample_size": sample_size,
        }
        if term is not None:  # summed over the batch (sum/batch·size): one value per update in reduce
            term = term * sample_size
            loss = loss + self.cfg.r3f_lambda * term
            logging_output["symm_kl"] = term.data
        if not self.regression_target:
            preds = logits.argmax(dim=1)
            logging_output["ncorrect"] = (preds == targets).sum()
        if self.coupled and model.training:
            loss = self._coupled_loss(model, loss, sample_size, logging_output)  # Loss_T: with the R3F term
        if not model.training:  # the GLUE metrics need the whole valid set
            if self.regression_target:  # Spearman needs every prediction (not summable: lists)
                logging_output["recadam_pred"] = logits.detach().view(-1).cpu().tolist()
                logging_output["recadam_targ"] = targets.detach().cpu().tolist()
            else:  # a confusion matrix sums across batches and workers
                k = logits.size(-1)
                pred, targ = logits.detach().argmax(dim=1), targets.detach()
                order = _label_values(self._label_dict, k)
                if order is not None:  # label ids follow the dictionary's frequency order
                    order = order.to(pred.device)
                    pred, targ = order[pred], order[targ]  # rows/columns = label values ("0", "1", ...)
                logging_output["recadam_confusion"] = torch.bincount(targ * k + pred, minlength=k * k).view(k, k)
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    def _coupled_loss(self, model, target_loss, sample_size, logging_output):
        cfg = self.cfg
        if self._anchors is None:  # first training forward: fairseq has loaded --restore-file
            params = [p for _, p in model.named_parameters() if p.requires_grad]
            line, anchors = build_anchors(params, model, cfg, resuming_is_error=True)
            self._anchors = [(p, a) for p, a, _ in anchors if a is not None]
            logger.info(f"recadam (coupled objective): {line}")
        dist = sum(((p.float() - a.float()) ** 2).sum() for p, a in self._anchors)
        penalty = 0.5 * cfg.recadam_pretrain_cof * dist
        w = cfg.recadam_anneal_w
        lam = anneal_lambda(str(cfg.recadam_anneal_fun), self.num_updates + 1, cfg.recadam_anneal_k,
                            cfg.recadam_anneal_t0, w)
        logging_output.update(recadam_lambda=lam, recadam_dist=dist.item(), recadam_penalty=penalty.item(),
                              recadam_count=1)
        # fairseq divides gradients by the summed sample size: scale the penalty to survive that
        return lam * target_loss + (w - lam) * penalty * sample_size

    # ----------------------------------------------------------------- metrics
    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        SentencePredictionCriterion.reduce_metrics(logging_outputs)  # loss, nll_loss, accuracy
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        target = sum(log.get("target_loss", 0) for log in logging_outputs)
        metrics.log_scalar("target_loss", target / max(sample_size, 1) / math.log(2), sample_size, round=3)
        if any("symm_kl" in log for log in logging_outputs):  # R3F: per sentence, in nats (as fairseq's)
            symm = sum(log.get("symm_kl", 0) for log in logging_outputs)
            metrics.log_scalar("symm_kl", symm / max(sample_size, 1), sample_size, round=3)
        count = sum(log.get("recadam_count", 0) for log in logging_outputs)
        if count:  # coupled objective: the same value on every worker and micro-batch: average it
            values = {k: sum(log.get(k, 0) for log in logging_outputs) / count for k in RECADAM_METRICS}
            log_recadam_metrics(**values)
        cms = [log["recadam_confusion"] for log in logging_outputs if "recadam_confusion" in log]
        if cms:
            _log_total("_recadam_confusion", sum(cm.cpu().double() for cm in cms))
            derived = {"mcc": glue_metrics.mcc_from_confusion}
            if cms[0].shape[0] == 2:
                derived["f1"] = glue_metrics.f1_from_confusion
                derived["acc_and_f1"] = glue_metrics.acc_and_f1_from_confusion
            for name, fn in derived.items():
                metrics.log_derived(name, _from_meter(fn, "_recadam_confusion"))
        pred = [x for log in logging_outputs for x in log.get("recadam_pred", [])]
        if pred:
            _log_total("_recadam_pred", pred)
            _log_total("_recadam_targ", [x for log in logging_outputs for x in log.get("recadam_targ", [])])
            for name, fn in REGRESSION_METRICS.items():
                metrics.log_derived(name, _from_meter(fn, "_recadam_pred", "_recadam_targ"))

    def logging_outputs_can_be_summed(self) -> bool:
        """Summable (fast, and the only way fairseq syncs on CPU) except the regression
        predictions, which are lists; λ and the distance are divided by their count after the sum."""
        return not self.regression_target


REGRESSION_METRICS = {
    "pearson": glue_metrics.pearson,
    "spearman": glue_metrics.spearman,
    "pearson_and_spearman": lambda p, t: (glue_metrics.pearson(p, t) + glue_metrics.spearman(p, t)) / 2,
}


def _from_meter(fn, *keys):
    def derived(meters):
        values = [meters[k].total for k in keys]
        return safe_round(100.0 * fn(*[np.asarray(v) for v in values]), 2)

    return derived


def _label_values(label_dict, k: int):
    """Label id -> the integer the label names (GLUE's "0"/"1"), or None unless they are 0..k-1."""
    if label_dict is None or len(label_dict) < label_dict.nspecial + k:
        return None
    names = [label_dict[label_dict.nspecial + i] for i in range(k)]
    try:
        values = [int(n) for n in names]
    except ValueError:
        return None
    return torch.tensor(values) if sorted(values) == list(range(len(values))) else None


@dataclass
class SentencePredictionR3FConfig(SentencePredictionRecAdamConfig):
    r3f_lambda: float = field(
        default=1.0,
        metadata={"help": "R3F: weight λ of the consistency term (symmetric KL of clean and noised outputs; "
                          "for --regression-target the squared difference); 0 turns R3F off"},
    )


@register_criterion("sentence_prediction_r3f", dataclass=SentencePredictionR3FConfig)
class SentencePredictionR3FCriterion(SentencePredictionRecAdamCriterion):
    """fairseq's examples/rxf ``sentence_prediction_r3f`` (R3F; R4F with --spectral-norm-classification-head):
    the criterion above with R3F on by default (--r3f-lambda 1.0)."""

    NAME = "sentence_prediction_r3f"
