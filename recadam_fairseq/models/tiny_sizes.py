"""The sizes of scripts/make_tiny_roberta.py's TINY_ARCH (the tests' tiny pretrained model): the ``*_tiny``
archs of the plug-in's models."""

from fairseq.utils import safe_getattr


def tiny_sizes(args) -> None:
    """TINY_ARCH's sizes where the flags do not set them."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 2)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 128)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 2)
    args.max_positions = safe_getattr(args, "max_positions", 64)
