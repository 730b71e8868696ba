"""``--criterion sentence_prediction_rdrop``: R-Drop (Liang et al., 2021) for GLUE-style heads:
``sentence_prediction_recadam`` with R-Drop on by default (``--rdrop-alpha 1.0``, the default of the
authors' fairseq criterion), one criterion and one copy of the code."""

from dataclasses import dataclass

from fairseq.criterions import register_criterion

from ..plumbing.config import RDropHyperparams, redefault
from .sentence_prediction_recadam import SentencePredictionRecAdamConfig, SentencePredictionRecAdamCriterion


@dataclass
class SentencePredictionRDropConfig(SentencePredictionRecAdamConfig):
    rdrop_alpha: float = redefault(RDropHyperparams, "rdrop_alpha", 1.0)


@register_criterion("sentence_prediction_rdrop", dataclass=SentencePredictionRDropConfig)
class SentencePredictionRDropCriterion(SentencePredictionRecAdamCriterion):
    NAME = "sentence_prediction_rdrop"
