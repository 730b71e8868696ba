"""``--arch roberta_ft_*``: fairseq's RoBERTa with the fine-tuning variants that change the model itself, and the
LayerNorms' eps of a model converted from Hugging Face.

- ``--reinit-layers N``: the top N encoder layers start from the model's own fresh initialisation
  (BERT's, as RobertaModel.__init__ applies it) instead of the pretrained weights (Zhang et al.,
  "Revisiting Few-sample BERT Fine-tuning", ICLR 2021). RoBERTa has no pooler to re-initialise:
  its classification head is new anyway.
- ``--lora-rank r``: LoRA (Hu et al., 2021, ``core/lora.py``) on ``--lora-modules`` of every layer;
  every pretrained tensor is frozen, A, B and the classification heads train.

- ``--mixout p``: Mixout (Lee et al., ICLR 2020, ``core/mixout.py``) on the six Linear weights of every
  encoder layer (q, k, v, out, fc1, fc2), toward the pretrained weights: in training each reads as
  θ* + M⊙(W − θ*)/(1 − p), M ~ Bernoulli(1 − p) per input neuron; in evaluation as W.

- ``--layer-norm-eps EPS``: every LayerNorm's eps (``models/layer_norm_eps.py``; fairseq's 1e-5 by default): a
  model converted from Hugging Face keeps its source's (a BERT's 1e-12) in the checkpoint's args; set when the
  model is built.

The first three act where fairseq loads ``--restore-file`` / ``--finetune-from-model``, before the optimizer
is built: ``upgrade_state_dict_named`` puts the model's own tensors under the names that are not
to be loaded (as fairseq does for new classification heads), so loading leaves them as they are and
RecAdam's anchor-by-name treats them as new (plain Adam). With no flag the model is fairseq's
RoBERTa: same tensors, names and random numbers.

A re-initialising model carries a buffer ``reinit_layers`` (N) in its state dict: a checkpoint that
has it was written by such a run (checkpoint_last.pt, fine-tuned) and loads as it is; one without it
is pretrained and gets its top layers replaced. A LoRA checkpoint tells itself by its names, and so
does a mixout one: its targets θ* are persistent buffers, loaded as they are when resuming; a
checkpoint without them (the pretrained one) sets every target to the weight it loads.
"""

import logging

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.roberta.model import roberta_large_architecture
from fairseq.tasks.translation import TranslationTask
from fairseq.utils import safe_getattr

from ..core import lora, mixout
from ..core.errors import ConfigError
from . import layer_norm_eps
from .tiny_sizes import tiny_sizes

# under fairseq's logger: recadam's anchor re-runs the upgrade quietly (it silences "fairseq.models" around it)
logger = logging.getLogger("fairseq.models.roberta_ft")

MARKER = "reinit_layers"
LAYERS = "encoder.sentence_encoder.layers"
DEFAULT_ALPHA, DEFAULT_MODULES = 8.0, "q,v"


def check_args(args) -> None:
    """The flags of roberta_ft, checked before the model is built (ConfigError naming the flag)."""
    n, layers = args.reinit_layers, args.encoder_layers
    if not 0 <= n <= layers:
        raise ConfigError(f"--reinit-layers {n}: must be between 0 and the model's {layers} encoder layers")
    modules = lora.parse_modules(args.lora_modules)
    r, alpha = args.lora_rank, args.lora_alpha
    p = args.mixout
    if not 0 <= p < 1:  # nan too
        raise ConfigError(f"--mixout {p:g}: must be in [0, 1) (0: off; at 1 every weight would be its pretrained "
                          f"value in training and nothing would learn)")
    if p and r:
        raise ConfigError(f"--mixout {p:g} with --lora-rank {r}: LoRA freezes every pretrained weight, so mixout "
                          f"would have nothing to mix; use one of them")
    if p and n == layers:
        raise ConfigError(f"--mixout {p:g} with --reinit-layers {n}: every encoder layer is re-initialised, no "
                          f"pretrained weight is left to mix toward")
    if r < 0:
        raise ConfigError(f"--lora-rank {r}: must be >= 1 (0: LoRA off)")
    if alpha <= 0:
        raise ConfigError(f"--lora-alpha {alpha:g}: must be > 0 (the scaling is α/r)")
    if r == 0:
        given = [f for f, v, d in (("--lora-alpha", alpha, DEFAULT_ALPHA), ("--lora-modules", modules,
                                                                              lora.parse_modules(DEFAULT_MODULES)))
                 if v != d]
        if given:
            raise ConfigError(f"{given[0]} has no effect without --lora-rank R (R >= 1; 0 = LoRA off)")
        return
    if n:
        raise ConfigError(f"--reinit-layers {n} with --lora-rank {r}: LoRA freezes every encoder weight, the "
                          f"re-initialised layers would stay random; use one of them")
    if safe_getattr(args, "optimizer", None) == "recadam":
        raise ConfigError(f"--lora-rank {r} with --optimizer recadam: LoRA freezes every pretrained tensor, so "
                          f"RecAdam has nothing to pull toward them; use --optimizer adam")


@register_model("roberta_ft")
class RobertaFtModel(RobertaModel):
    """RoBERTa with ``--reinit-layers``, LoRA (``--lora-rank``, ``--lora-alpha``, ``--lora-modules``) and
    ``--mixout``."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--reinit-layers", type=int, metavar="N",
                            help="re-initialise the top N encoder layers (BERT's init, as a fresh model) after "
                                 "the pretrained weights load; not again when resuming (default 0)")
        parser.add_argument("--lora-rank", type=int, metavar="R",
                            help="LoRA rank r on --lora-modules of every encoder layer; freezes every pretrained "
                                 "tensor (default 0: LoRA off)")
        parser.add_argument("--lora-alpha", type=float, metavar="A",
                            help="LoRA's α: the update B·A is scaled by α/r (default 8)")
        parser.add_argument("--lora-modules", type=str, metavar="LIST",
                            help="comma-separated Linear layers of each encoder layer that get LoRA: q, k, v, "
                                 "out (attention output), fc1, fc2 (default q,v)")
        parser.add_argument("--mixout", type=float, metavar="P",
                            help="mixout probability p in [0, 1) on the six Linear weights of every encoder layer "
                                 "(q, k, v, out, fc1, fc2), toward the pretrained weights loaded from the checkpoint; "
                                 "kept in the checkpoint, not reset when resuming (default 0: off)")
        layer_norm_eps.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        if isinstance(task, TranslationTask):  # else a TypeError deep in RoBERTa's positional embeddings
            raise ConfigError(f"--arch {args.arch}: the roberta_ft models are RoBERTa encoders for sentence "
                              f"classification; --task translation needs an encoder-decoder (transformer*, bart_*)")
        roberta_ft_architecture(args)
        check_args(args)
        layer_norm_eps.check(args)
        return super().build_model(args, task)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # BERT's init on every tensor: what --reinit-layers keeps
        layer_norm_eps.apply(self, args)
        n = args.reinit_layers
        self.reinit_indices = list(range(args.encoder_layers - n, args.encoder_layers))
        if n:
            self.register_buffer(MARKER, torch.tensor(n))
        self.lora_weights = {}  # plain weight name -> its LoRA parametrization
        r, alpha = args.lora_rank, args.lora_alpha
        if r > 0:
            for p in self.parameters():
                p.requires_grad_(False)  # classification heads come later (task.build_model): they train
            modules = dict(self.named_modules())
            layers = len(self.encoder.sentence_encoder.layers)
            for i in range(layers):
                for short in lora.parse_modules(args.lora_modules):
                    path = f"{LAYERS}.{i}.{lora.MODULES[short]}"
                    self.lora_weights[path + ".weight"] = lora.add_lora(modules[path], r, alpha)
            trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
            frozen = sum(p.numel() for p in self.parameters() if not p.requires_grad)
            logger.info(f"roberta_ft: LoRA r={r} α={alpha:g} (scaling {alpha / r:g}) on {args.lora_modules} of "
                        f"{layers} layers: {len(self.lora_weights)} weights; trainable A, B: {trainable:,} elements; "
                        f"frozen: {frozen:,} (every pretrained tensor); the classification heads train")
        self.mixout_weights = {}  # plain weight name -> its mixout parametrization
        p = args.mixout
        if p > 0:
            modules = dict(self.named_modules())
            layers = [i for i in range(args.encoder_layers) if i not in self.reinit_indices]
            for i in layers:
                for path in lora.MODULES.values():
                    path = f"{LAYERS}.{i}.{path}"
                    self.mixout_weights[path + ".weight"] = mixout.add_mixout(modules[path], p)
            numel = sum(m.target.numel() for m in self.mixout_weights.values())
            skipped = (f"; none in the re-initialised layers {self.reinit_indices[0]}-{self.reinit_indices[-1]} "
                       f"(no pretrained target)" if self.reinit_indices else "")
            logger.info(f"roberta_ft: mixout p={p:g} on q,k,v,out,fc1,fc2 of layers {layers[0]}-{layers[-1]}: "
                        f"{len(self.mixout_weights)} weights, {numel:,} elements{skipped}; the classification "
                        f"heads have none")

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's upgrade, then LoRA's names and the re-initialised layers (the model's own tensors go in)."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name != "" else ""
        own = self.state_dict()
        self._plain_mixout(state_dict, prefix)
        self._upgrade_lora(state_dict, prefix, own)
        self._upgrade_mixout(state_dict, prefix)
        self._upgrade_reinit(state_dict, prefix, own)

    def _plain_mixout(self, state_dict, prefix):
        """A mixout checkpoint's weights this model does not mix: W under the plain name, the target dropped."""
        ckpt = mixout.mixout_groups({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
        plain = [w for w in ckpt if w not in self.mixout_weights]
        for w in plain:
            state_dict[prefix + w] = state_dict.pop(prefix + ckpt[w]["original"])
            del state_dict[prefix + ckpt[w]["0.target"]]
        if plain:
            logger.info(f"roberta_ft: {len(plain)} mixout weights of the checkpoint loaded as plain weights (W; "
                        f"their targets dropped)")

    def _upgrade_mixout(self, state_dict, prefix):
        """W of a plain checkpoint goes to ``.original`` and becomes the target too (a checkpoint without
        targets is the pretrained one); a checkpoint with targets (this run's: resuming) keeps them."""
        fresh, kept = [], []
        for plain in self.mixout_weights:
            base = prefix + plain[:-len(".weight")] + ".parametrizations.weight."
            if base + "0.target" in state_dict:
                kept.append(plain)
            elif prefix + plain in state_dict or base + "original" in state_dict:
                w = state_dict.pop(prefix + plain) if prefix + plain in state_dict else state_dict[base + "original"]
                state_dict[base + "original"] = state_dict[base + "0.target"] = w  # two tensors once loaded
                fresh.append(plain)
        if fresh:
            logger.info(f"roberta_ft: mixout targets θ* = the loaded weights for {len(fresh)} weights (the "
                        f"checkpoint has none: a pretrained model)")
        if kept:
            logger.info(f"roberta_ft: mixout targets θ* of {len(kept)} weights loaded from the checkpoint (a mixout "
                        f"run's), not reset")

    def _upgrade_lora(self, state_dict, prefix, own):
        ckpt = lora.lora_groups({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
        merged = [p for p in ckpt if p not in self.lora_weights]
        for plain in merged:  # a LoRA checkpoint, that module plain here: W' under its plain name
            parts = {part: state_dict.pop(prefix + key) for part, key in ckpt[plain].items()}
            with torch.no_grad():
                state_dict[prefix + plain] = lora.lora_weight(parts["original"], parts["0.lora_A"],
                                                              parts["0.lora_B"], parts["0.scaling"])
        if merged:
            logger.info(f"roberta_ft: {len(merged)} LoRA weights of the checkpoint merged (W + B·A·α/r): "
                        f"{', '.join(merged)}")
        fresh, kept = [], []
        for plain in self.lora_weights:
            base = plain[:-len(".weight")] + ".parametrizations.weight."
            if prefix + plain in state_dict:  # pretrained: W is the frozen original, A and B start fresh
                state_dict[prefix + base + "original"] = state_dict.pop(prefix + plain)
                for part in ("0.lora_A", "0.lora_B", "0.scaling"):
                    state_dict[prefix + base + part] = own[base + part]
                fresh.append(plain)
            elif prefix + base + "0.scaling" in state_dict:
                kept.append(float(state_dict[prefix + base + "0.scaling"]))
        if fresh:
            logger.info(f"roberta_ft: {len(fresh)} pretrained weights frozen under LoRA; their A, B start fresh "
                        f"(B = 0: the pretrained function)")
        mine = float(next(iter(self.lora_weights.values())).scaling) if self.lora_weights else None
        if kept and any(s != mine for s in kept):
            logger.warning(f"roberta_ft: the checkpoint's LoRA scaling {kept[0]:g} is kept (--lora-alpha / "
                           f"--lora-rank give {mine:g})")

    def _upgrade_reinit(self, state_dict, prefix, own):
        if not hasattr(self, MARKER):
            state_dict.pop(prefix + MARKER, None)  # a re-initialising run's checkpoint, loaded without it
            return
        n = int(getattr(self, MARKER))
        if prefix + MARKER in state_dict:
            written = int(state_dict[prefix + MARKER])
            logger.info(f"roberta_ft: the checkpoint was written by a --reinit-layers {written} run: loaded as it "
                        f"is, no layer re-initialised")
            return
        starts = tuple(f"{LAYERS}.{i}." for i in self.reinit_indices)
        names = [k for k in own if k.startswith(starts)]
        for k in names:
            state_dict[prefix + k] = own[k]
        state_dict[prefix + MARKER] = own[MARKER]
        layers = ", ".join(s[:-1] for s in starts)
        logger.info(f"roberta_ft: --reinit-layers {n}: {layers} re-initialised ({len(names)} tensors, "
                    f"{sum(own[k].numel() for k in names):,} elements, BERT's init as a fresh model), not loaded "
                    f"from the checkpoint; --optimizer recadam treats them as new (plain Adam, not pulled "
                    f"toward θ*)")


def _ft_defaults(args):
    args.reinit_layers = safe_getattr(args, "reinit_layers", 0)
    args.lora_rank = safe_getattr(args, "lora_rank", 0)
    args.lora_alpha = safe_getattr(args, "lora_alpha", DEFAULT_ALPHA)
    args.lora_modules = safe_getattr(args, "lora_modules", DEFAULT_MODULES)
    args.mixout = safe_getattr(args, "mixout", 0.0)
    layer_norm_eps.defaults(args)


@register_model_architecture("roberta_ft", "roberta_ft")
def roberta_ft_architecture(args):
    _ft_defaults(args)
    roberta_base_architecture(args)


@register_model_architecture("roberta_ft", "roberta_ft_base")
def roberta_ft_base_architecture(args):
    roberta_ft_architecture(args)


@register_model_architecture("roberta_ft", "roberta_ft_large")
def roberta_ft_large_architecture(args):
    _ft_defaults(args)
    roberta_large_architecture(args)


@register_model_architecture("roberta_ft", "roberta_ft_tiny")
def roberta_ft_tiny_architecture(args):
    tiny_sizes(args)
    roberta_ft_architecture(args)
