"""R3F's consistency term for GLUE-style heads (``--r3f-lambda`` > 0), added to the criterion's loss. R-Drop's
(``--rdrop-alpha`` > 0, ``rdrop_term.py``) is the same term between another pair of passes: it takes
``consistency`` and the ``symm_kl`` metric (``reduce_symm_kl``) from here.

A second forward on noised token embeddings and λ·KL_S(f(x) ‖ f(x+z)) (the regression head: the
squared difference), with fairseq's ``examples/rxf`` draws and order (``core/r3f.py``): clean
forward (its dropout draws), the noise, the noised forward, then the term. The noised embeddings
reach fairseq's stock RoBERTa encoder here (its ``RobertaEncoder.forward`` drops a
``token_embeddings`` argument, so fairseq's rxf runs the clean tokens twice on ``roberta_*``).
"""

from fairseq.logging import metrics
from fairseq.models.roberta.model import RobertaEncoder

from ..core import r3f
from .glue_core import head_logits


def embed_tokens(model):
    return getattr(getattr(getattr(model, "encoder", None), "sentence_encoder", None), "embed_tokens", None)


def logits_from_embeddings(model, net_input, embeddings, head: str):
    """The head's output with ``embeddings`` as the encoder's token embeddings: what RobertaModel.forward
    would compute if the encoder passed them on (encoders with their own forward, such as
    ca_mtl_roberta's, get them through the model)."""
    encoder = getattr(model, "encoder", None)
    if isinstance(encoder, RobertaEncoder) and type(encoder).forward is RobertaEncoder.forward:
        features, _ = encoder.extract_features(net_input["src_tokens"], token_embeddings=embeddings)
        return model.classification_heads[head](features)
    return head_logits(model, net_input, head, token_embeddings=embeddings)


def clean_and_consistency(model, net_input, head: str, eps: float, noise_type: str, regression: bool):
    """(clean logits, the consistency term over the batch size), in fairseq's order of draws."""
    embeddings = embed_tokens(model)(net_input["src_tokens"])
    logits = logits_from_embeddings(model, net_input, embeddings, head)
    noise = r3f.sample_noise(embeddings.shape, eps, noise_type)
    noised = logits_from_embeddings(model, net_input, r3f.add_noise(embeddings, noise), head)
    return logits, consistency(regression)(noised, logits)


def consistency(regression: bool):
    """KL_S of the two passes' class distributions, or for a regression head their squared difference."""
    return r3f.regression_consistency if regression else r3f.symm_kl


def reduce_symm_kl(logging_outputs) -> None:
    """``symm_kl``: the summed term over the update's sample size (all micro-batches and ranks), in nats
    (the GLUE criteria: per sentence)."""
    if any("symm_kl" in log for log in logging_outputs):
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        symm = sum(log.get("symm_kl", 0) for log in logging_outputs)
        metrics.log_scalar("symm_kl", symm / max(sample_size, 1), sample_size, round=3)
