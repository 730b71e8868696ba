"""``--arch ca_mtl_roberta_*``: CA-MTL's task-conditioned RoBERTa (Pilault et al., ICLR 2021).

fairseq's RoBERTa with the conditional modules of ``recadam_fairseq/conditional_modules.py``:
a task embedding z, conditional alignment after the embeddings, a conditional (block-diagonal)
attention bias, conditional layer norm in the upper half of the layers and a conditional
bottleneck adapter in the top layer. Every pretrained tensor keeps RoBERTa's name, so
``--restore-file roberta.base/model.pt`` fills the shared parts; the new tensors (names absent
from a RoBERTa checkpoint) are filled with their identity initialisation by
``upgrade_state_dict_named``, and RecAdam's anchor-by-name gives them plain Adam.

forward(src_tokens, ..., task_ids=None): task_ids is a LongTensor [B] (one task per example) or
None (every example is task 0, e.g. ``--task sentence_prediction``).
"""

import logging
from typing import List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.roberta.model import roberta_large_architecture
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.tasks.translation import TranslationTask
from fairseq.utils import safe_getattr, safe_hasattr
from torch import Tensor

from ..core.errors import ConfigError
from . import layer_norm_eps
from .tiny_sizes import tiny_sizes
from ..core.layers import parse_layers
from ..core.conditional_modules import (
    ConditionalAlignment,
    ConditionalAttentionBias,
    ConditionalBottleneck,
    ConditionalLayerNorm,
    TaskEmbedding,
    new_tensor_names,
    reset_conditional_parameters,
)

# under fairseq's logger: recadam's anchor re-runs the upgrade quietly (it silences "fairseq")
logger = logging.getLogger("fairseq.models.ca_mtl_roberta")


class CaMtlPlan:
    """Which conditional module goes where, from the ``--ca-mtl-*`` flags (checked here)."""

    def __init__(self, args):
        n, dim = args.encoder_layers, args.encoder_embed_dim
        self.cln = set(parse_layers(args.ca_mtl_cln_layers, n, "--ca-mtl-cln-layers"))
        self.attn = set(parse_layers(args.ca_mtl_attn_layers, n, "--ca-mtl-attn-layers"))
        self.adapter = set(parse_layers(args.ca_mtl_adapter_layers, n, "--ca-mtl-adapter-layers"))
        self.alignment = not args.ca_mtl_no_alignment
        self.adapter_dim = args.ca_mtl_adapter_dim or max(1, dim // 3)
        self.max_len = args.ca_mtl_attn_max_len
        self.blocks = args.ca_mtl_attn_blocks or max(1, dim // self.max_len)
        if self.adapter_dim < 1:
            raise ConfigError(f"--ca-mtl-adapter-dim {args.ca_mtl_adapter_dim}: must be >= 1 (0: embed dim // 3)")
        if self.max_len < 1 or not 1 <= self.blocks <= self.max_len:
            raise ConfigError(f"--ca-mtl-attn-blocks {self.blocks} / --ca-mtl-attn-max-len {self.max_len}: "
                             f"need 1 <= blocks <= max len")
        if self.attn and safe_getattr(args, "encoder_xformers_att_config", None):
            raise ConfigError("--ca-mtl-attn-layers needs fairseq's own attention: drop --encoder-xformers-att-config "
                             "or pass --ca-mtl-attn-layers none")
        self.next_layer = 0


class CaMtlEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer (same submodules and names) with the conditional modules of its index.

    ``forward`` is the base layer's with z threaded through: the attention bias enters
    MultiheadAttention as a float ``attn_mask`` [B·H, T, T] (the base layer would binarise it).
    """

    def __init__(self, cfg, index: int, plan: CaMtlPlan, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        dim = self.embed_dim
        if index in plan.cln:  # same weight/bias names: the pretrained layer norms load into them
            self.self_attn_layer_norm = ConditionalLayerNorm(dim, dim, eps=self.self_attn_layer_norm.eps)
            self.final_layer_norm = ConditionalLayerNorm(dim, dim, eps=self.final_layer_norm.eps)
        self.attn_bias = ConditionalAttentionBias(dim, plan.max_len, plan.blocks) if index in plan.attn else None
        self.adapter = ConditionalBottleneck(dim, plan.adapter_dim, dim) if index in plan.adapter else None

    @staticmethod
    def _norm(norm, x: Tensor, z: Tensor) -> Tensor:
        return norm(x, z, batch_dim=1) if isinstance(norm, ConditionalLayerNorm) else norm(x)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None,
                z: Optional[Tensor] = None):
        """x: [T, B, C]; z: task embeddings [B, C]."""
        seq_len, bsz = x.shape[:2]
        if attn_mask is not None:  # the base layer's binary-mask convention
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)
        key_padding_mask = encoder_padding_mask
        if self.attn_bias is not None:
            bias = self.attn_bias(z, seq_len).to(x.dtype)  # [B, T, T]
            if attn_mask is not None:
                bias = bias + attn_mask
            if key_padding_mask is not None:  # one float mask (torch deprecates mixing bool and float masks)
                bias = bias.masked_fill(key_padding_mask[:, None, :].to(torch.bool), float("-inf"))
                key_padding_mask = None
            heads = self.self_attn.num_heads
            attn_mask = bias.unsqueeze(1).expand(bsz, heads, seq_len, seq_len).reshape(bsz * heads, seq_len, seq_len)

        residual = x
        if self.normalize_before:
            x = self._norm(self.self_attn_layer_norm, x, z)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=key_padding_mask, need_weights=False,
                              attn_mask=attn_mask)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self._norm(self.self_attn_layer_norm, x, z)

        residual = x
        if self.normalize_before:
            x = self._norm(self.final_layer_norm, x, z)
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        x = self.fc2(x)
        fc_result = x
        x = self.dropout_module(x)
        if self.adapter is not None:  # Houlsby placement: on the FFN output, inside its residual
            x = x + self.adapter(x, z, batch_dim=1)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self._norm(self.final_layer_norm, x, z)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x


class CaMtlTransformerEncoder(TransformerEncoder):
    """fairseq's TransformerEncoder whose layers are CaMtlEncoderLayer; adds the task embedding and alignment."""

    def __init__(self, args, dictionary, embed_tokens, num_tasks: int):
        self.ca_mtl_plan = CaMtlPlan(args)  # read by build_encoder_layer during super().__init__
        super().__init__(args, dictionary, embed_tokens)
        dim = embed_tokens.embedding_dim
        self.task_embedding = TaskEmbedding(num_tasks, dim)
        self.alignment = ConditionalAlignment(dim) if self.ca_mtl_plan.alignment else None

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        index, self.ca_mtl_plan.next_layer = self.ca_mtl_plan.next_layer, self.ca_mtl_plan.next_layer + 1
        layer = CaMtlEncoderLayer(cfg, index, self.ca_mtl_plan, return_fc=self.return_fc)
        checkpoint = cfg.checkpoint_activations  # as TransformerEncoderBase.build_encoder_layer
        if checkpoint:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None, task_ids: Optional[Tensor] = None):
        """TransformerEncoderBase.forward_scriptable with z threaded through the layers."""
        bsz = src_tokens.size(0)
        if task_ids is None:
            task_ids = src_tokens.new_zeros(bsz)
        elif task_ids.shape != (bsz,):
            raise ValueError(f"task_ids must have shape [batch size] = [{bsz}], got {tuple(task_ids.shape)}")
        z = self.task_embedding(task_ids)

        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = encoder_padding_mask.any()
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if self.alignment is not None:
            x = self.alignment(z, x, batch_dim=0)
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states: List[Tensor] = [x] if return_all_hiddens else []
        fc_results = []
        for layer in self.layers:
            lr = layer(x, encoder_padding_mask=encoder_padding_mask if has_pads else None, z=z)
            x, fc_result = lr if isinstance(lr, tuple) and len(lr) == 2 else (lr, None)
            if return_all_hiddens:
                encoder_states.append(x)
                fc_results.append(fc_result)
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": fc_results,
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class CaMtlRobertaEncoder(RobertaEncoder):
    """RobertaEncoder (embeddings, LM head: same names) over a CaMtlTransformerEncoder."""

    def __init__(self, args, dictionary, num_tasks: int):
        self.ca_mtl_num_tasks = num_tasks  # read by build_encoder during super().__init__
        super().__init__(args, dictionary)

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = CaMtlTransformerEncoder(args, dictionary, embed_tokens, self.ca_mtl_num_tasks)
        encoder.apply(init_bert_params)
        return encoder

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, masked_tokens=None,
                task_ids=None, token_embeddings=None, **unused):
        # token_embeddings reaches the encoder (RobertaEncoder.forward drops it): R3F's noised embeddings
        x, extra = self.extract_features(src_tokens, return_all_hiddens=return_all_hiddens, task_ids=task_ids,
                                         token_embeddings=token_embeddings)
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra

    def extract_features(self, src_tokens, return_all_hiddens=False, task_ids=None, **kwargs):
        encoder_out = self.sentence_encoder(src_tokens, return_all_hiddens=return_all_hiddens,
                                            token_embeddings=kwargs.get("token_embeddings", None), task_ids=task_ids)
        features = encoder_out["encoder_out"][0].transpose(0, 1)  # T x B x C -> B x T x C
        inner_states = encoder_out["encoder_states"] if return_all_hiddens else None
        return features, {"inner_states": inner_states}


@register_model("ca_mtl_roberta")
class CaMtlRobertaModel(RobertaModel):
    """RoBERTa conditioned on the task of each example (CA-MTL)."""

    is_task_conditioned = True

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--ca-mtl-cln-layers", type=str, metavar="LAYERS",
                            help="layers whose two layer norms are conditional (FiLM-modulated gain), in the "
                                 "plug-in's layer syntax: all, none, lower, upper (the upper half, the paper's "
                                 "choice; default), top, or indices like 6-11")
        parser.add_argument("--ca-mtl-attn-layers", type=str, metavar="LAYERS",
                            help="layers with the conditional block-diagonal attention bias (default: all, "
                                 "as the authors' code); same syntax as --ca-mtl-cln-layers")
        parser.add_argument("--ca-mtl-adapter-layers", type=str, metavar="LAYERS",
                            help="layers with a conditional bottleneck adapter on their FFN output "
                                 "(default: top, the paper's choice); same syntax as --ca-mtl-cln-layers")
        parser.add_argument("--ca-mtl-adapter-dim", type=int, metavar="N",
                            help="bottleneck size of the conditional adapter (default 0 = embed dim // 3, "
                                 "the authors' size)")
        parser.add_argument("--ca-mtl-attn-max-len", type=int, metavar="L",
                            help="positions covered by the conditional attention bias; later positions get none "
                                 "(default 128, the authors' max sequence length; tiny: 32)")
        parser.add_argument("--ca-mtl-attn-blocks", type=int, metavar="N",
                            help="diagonal blocks of the attention bias, each ceil(L/N) wide (default 0 = "
                                 "max(1, embed dim // L), the authors' rule; tiny: 4)")
        parser.add_argument("--ca-mtl-no-alignment", action="store_true",
                            help="leave out the conditional alignment after the embeddings (an ablation)")
        layer_norm_eps.add_args(parser)  # (a converted BERT's 1e-12, as roberta_ft's)

    @classmethod
    def build_model(cls, args, task):
        """RobertaModel.build_model with the conditioned encoder; tasks from ``task.mt_task_names``."""
        from omegaconf import OmegaConf

        if isinstance(task, TranslationTask):  # else a TypeError deep in RoBERTa's positional embeddings
            raise ConfigError(f"--arch {args.arch}: CA-MTL is a RoBERTa encoder for sentence classification; "
                              f"--task translation needs an encoder-decoder (transformer*, bart_*)")

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        ca_mtl_base_architecture(args)
        layer_norm_eps.check(args)
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        num_tasks = len(getattr(task, "mt_task_names", [None]))
        encoder = CaMtlRobertaEncoder(args, task.source_dictionary, num_tasks)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # re-initialises every Linear/Embedding (BERT init) ...
        reset_conditional_parameters(self.encoder)  # ... so put the conditional modules back to the identity
        layer_norm_eps.apply(self, args)

    @property
    def num_tasks(self) -> int:
        return self.encoder.sentence_encoder.task_embedding.num_tasks

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None,
                task_ids=None, **kwargs):
        return super().forward(src_tokens, features_only=features_only, return_all_hiddens=return_all_hiddens,
                               classification_head_name=classification_head_name, task_ids=task_ids, **kwargs)

    def conditional_tensor_names(self) -> List[str]:
        """The tensors CA-MTL adds to RoBERTa (none of them exists in a RoBERTa checkpoint)."""
        return new_tensor_names(self)

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's upgrade, then the conditional tensors a checkpoint lacks take the model's fresh ones.

        The model's own tensors go in (as fairseq does for new classification heads), so loading
        leaves them as they are and recadam's anchor recognises them as not pretrained.
        """
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name != "" else ""
        own = self.state_dict()
        missing = [n for n in self.conditional_tensor_names() if prefix + n not in state_dict]
        for n in missing:
            state_dict[prefix + n] = own[n]
        if missing:
            numel = sum(own[n].numel() for n in missing)
            logger.info(f"ca_mtl_roberta: {len(missing)} conditional tensors ({numel:,} elements) are not in the "
                        f"checkpoint and start from their identity initialisation: {', '.join(missing)}")


def _ca_mtl_defaults(args, attn_max_len=128, attn_blocks=0):
    args.ca_mtl_cln_layers = safe_getattr(args, "ca_mtl_cln_layers", "upper")
    args.ca_mtl_attn_layers = safe_getattr(args, "ca_mtl_attn_layers", "all")
    args.ca_mtl_adapter_layers = safe_getattr(args, "ca_mtl_adapter_layers", "top")
    args.ca_mtl_adapter_dim = safe_getattr(args, "ca_mtl_adapter_dim", 0)
    args.ca_mtl_attn_max_len = safe_getattr(args, "ca_mtl_attn_max_len", attn_max_len)
    args.ca_mtl_attn_blocks = safe_getattr(args, "ca_mtl_attn_blocks", attn_blocks)
    args.ca_mtl_no_alignment = safe_getattr(args, "ca_mtl_no_alignment", False)
    layer_norm_eps.defaults(args)


@register_model_architecture("ca_mtl_roberta", "ca_mtl_roberta")
def ca_mtl_base_architecture(args):
    _ca_mtl_defaults(args)
    roberta_base_architecture(args)


@register_model_architecture("ca_mtl_roberta", "ca_mtl_roberta_base")
def ca_mtl_roberta_base_architecture(args):
    ca_mtl_base_architecture(args)


@register_model_architecture("ca_mtl_roberta", "ca_mtl_roberta_large")
def ca_mtl_roberta_large_architecture(args):
    _ca_mtl_defaults(args)
    roberta_large_architecture(args)


@register_model_architecture("ca_mtl_roberta", "ca_mtl_roberta_tiny")
def ca_mtl_roberta_tiny_architecture(args):
    tiny_sizes(args)
    _ca_mtl_defaults(args, attn_max_len=32, attn_blocks=4)
    roberta_base_architecture(args)
