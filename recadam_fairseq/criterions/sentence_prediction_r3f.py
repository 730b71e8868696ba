"""``--criterion sentence_prediction_r3f``: fairseq's examples/rxf name for R3F (R4F with
``--spectral-norm-classification-head``): ``sentence_prediction_recadam`` with R3F on by default
(``--r3f-lambda 1.0``, fairseq's default), one criterion and one copy of the code."""

from dataclasses import dataclass

from fairseq.criterions import register_criterion

from ..plumbing.config import R3FHyperparams, redefault
from .sentence_prediction_recadam import SentencePredictionRecAdamConfig, SentencePredictionRecAdamCriterion


@dataclass
class SentencePredictionR3FConfig(SentencePredictionRecAdamConfig):
    r3f_lambda: float = redefault(R3FHyperparams, "r3f_lambda", 1.0)


@register_criterion("sentence_prediction_r3f", dataclass=SentencePredictionR3FConfig)
class SentencePredictionR3FCriterion(SentencePredictionRecAdamCriterion):
    NAME = "sentence_prediction_r3f"
