"""Test-only arch ``roberta_tokemb_test``: fairseq's RoBERTa whose encoder forward hands ``token_embeddings``
to extract_features (fairseq 0.12's RobertaEncoder.forward drops it). On it fairseq's examples/rxf noise
reaches the encoder, so it can serve as the oracle for ours. Imported by the temporary --user-dir packages
of tests/test_r3f.py (fairseq's rxf and ours), so both processes build the same model.
"""

from fairseq.models import MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel, base_architecture

NAME = "roberta_tokemb_test"


class TokEmbRobertaEncoder(RobertaEncoder):
    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, masked_tokens=None,
                token_embeddings=None, **unused):
        x, extra = self.extract_features(src_tokens, return_all_hiddens=return_all_hiddens,
                                         token_embeddings=token_embeddings)
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra


if NAME not in MODEL_REGISTRY:

    @register_model(NAME)
    class TokEmbRobertaModel(RobertaModel):
        @classmethod
        def build_model(cls, args, task):  # RobertaModel.build_model with the encoder above
            from omegaconf import OmegaConf

            if OmegaConf.is_config(args):
                OmegaConf.set_struct(args, False)
            base_architecture(args)
            if getattr(args, "max_positions", None) is None:
                args.max_positions = getattr(args, "tokens_per_sample", None) or task.max_positions()
            encoder = TokEmbRobertaEncoder(args, task.source_dictionary)
            if OmegaConf.is_config(args):
                OmegaConf.set_struct(args, True)
            return cls(args, encoder)

    @register_model_architecture(NAME, NAME)
    def tokemb_architecture(args):
        base_architecture(args)
