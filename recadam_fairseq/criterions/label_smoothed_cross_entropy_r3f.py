"""``--criterion label_smoothed_cross_entropy_r3f``: R3F for sequence-to-sequence (translation, BART).

fairseq's ``label_smoothed_cross_entropy`` plus λ·symm_kl between the decoder's output on clean and on
noised source-token embeddings, with fairseq's examples/rxf draws, order and defaults (``--noise-type
normal`` here). As there, the noised copy is not detached from the embedding lookup, the symmetric KL
runs over every target position (padding too) and is scaled by the sample size. Beyond fairseq's: a
model whose ``forward`` takes no ``token_embeddings`` (fairseq's ``transformer``) gets the noised pass
through its encoder and decoder called directly; the flags are checked at start; fp16 noise as in r3f.py.
"""

import inspect
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum

from ..core import r3f
from ..core.errors import ConfigError
from ..meters import InstallsWhenTraining
from ..plumbing.config import BestCheckpointMetric, BleuStartConfig, R3FHyperparams, redefault
from .bleu_check import check_bleu
from .r3f_term import reduce_symm_kl


@dataclass
class LabelSmoothedCrossEntropyR3FConfig(LabelSmoothedCrossEntropyCriterionConfig, R3FHyperparams,
                                         BestCheckpointMetric, BleuStartConfig):
    r3f_lambda: float = redefault(R3FHyperparams, "r3f_lambda", 1.0)  # fairseq's seq2seq defaults
    noise_type: ChoiceEnum(list(r3f.NOISE_TYPES)) = redefault(R3FHyperparams, "noise_type", "normal")


@register_criterion("label_smoothed_cross_entropy_r3f", dataclass=LabelSmoothedCrossEntropyR3FConfig)
class LabelSmoothedCrossEntropyR3FCriterion(InstallsWhenTraining, LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, eps, r3f_lambda, noise_type,
                 ignore_prefix_size=0, report_accuracy=False, best_checkpoint_metric=None,
                 maximize_best_checkpoint_metric=None, cfg=None):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        r3f.check_hyperparams(eps, r3f_lambda, str(noise_type))
        check_bleu(task, best_checkpoint_metric, maximize_best_checkpoint_metric)
        self.noise_eps, self.r3f_lambda, self.noise_type = eps, r3f_lambda, str(noise_type)  # self.eps: smoothing
        self.r3f = r3f_lambda > 0 and eps > 0
        self.meters_cfg = cfg  # --eval-bleu-start (meters/bleu_start.py)
        self._takes_embeddings = None

    def _check_model(self, model):
        if getattr(getattr(model, "encoder", None), "embed_tokens", None) is None:
            raise ConfigError(f"--r3f-lambda {self.r3f_lambda}: R3F noises the source token embeddings, and this "
                             f"model ({type(model).__name__}) has no encoder.embed_tokens")
        self._takes_embeddings = "token_embeddings" in inspect.signature(model.forward).parameters

    def _noised_forward(self, model, net_input, embeddings):
        if self._takes_embeddings:  # BART
            return model(**net_input, token_embeddings=embeddings)
        # fairseq's transformer: what its forward does, with the embeddings given to the encoder
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"],
                                    return_all_hiddens=True, token_embeddings=embeddings)
        return model.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out,
                             src_lengths=net_input["src_lengths"], return_all_hiddens=True)

    def forward(self, model, sample, reduce=True):
        if not (self.r3f and model.training):
            return super().forward(model, sample, reduce=reduce)
        if self._takes_embeddings is None:
            self._check_model(model)
        net_input = sample["net_input"]
        embeddings = model.encoder.embed_tokens(net_input["src_tokens"])  # fairseq's order of draws
        net_output = model(**net_input)
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        noise = r3f.sample_noise(embeddings.shape, self.noise_eps, self.noise_type)
        noised_logits, _ = self._noised_forward(model, net_input, r3f.add_noise(embeddings, noise, detach=False))
        term = r3f.symm_kl(noised_logits, net_output[0]) * sample_size
        loss = loss + self.r3f_lambda * term
        logging_output = {
            "loss": loss.data, "nll_loss": nll_loss.data, "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0), "sample_size": sample_size, "symm_kl": term.data,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output.update(n_correct=n_correct.data, total=total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        reduce_symm_kl(logging_outputs)
