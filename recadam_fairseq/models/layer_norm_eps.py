"""``--layer-norm-eps``: the eps of every LayerNorm of the plug-in's RoBERTa models (roberta_ft, ca_mtl_roberta).

fairseq builds its LayerNorms with a fixed 1e-5; BERT, DistilBERT and most Hugging Face encoders use 1e-12. A model
converted from one (prepare/convert_hf.py) carries its own eps in the checkpoint's args, so that fine-tuning starts
from the function the user's checkpoint computes, not from one 1e-3 away (MiniLM's hidden states: 0.0078)."""

import math

from ..core.errors import ConfigError

FAIRSEQ_EPS = 1e-5  # fairseq.modules.LayerNorm's (this module imports no fairseq: the converter reads it too)


def add_args(parser) -> None:
    parser.add_argument("--layer-norm-eps", type=float, metavar="EPS",
                        help="the eps of every LayerNorm (default 1e-5, fairseq's; a model converted from a BERT "
                             "keeps its 1e-12: data-prep/convert_hf_to_fairseq.py writes it into the checkpoint)")


def defaults(args) -> None:
    from fairseq.utils import safe_getattr

    args.layer_norm_eps = safe_getattr(args, "layer_norm_eps", FAIRSEQ_EPS)


def check(args) -> None:
    eps = args.layer_norm_eps
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ConfigError(f"--layer-norm-eps {eps}: must be a positive number (fairseq's is 1e-5, BERT's 1e-12)")


def apply(model, args) -> None:
    """Every layer norm of ``model`` (torch's, apex's, CA-MTL's conditional one: a module with normalized_shape and
    eps) computes with ``args.layer_norm_eps`` (fairseq's where args, e.g. an old checkpoint's, has none)."""
    eps = getattr(args, "layer_norm_eps", None) or FAIRSEQ_EPS
    for m in model.modules():
        if hasattr(m, "normalized_shape") and hasattr(m, "eps"):
            m.eps = float(eps)
