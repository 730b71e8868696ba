"""The runs of a generated RoBERTa (make_tiny_roberta.py's tiny one, or the GPU pass's roberta-base shapes): THE
fine-tuning command from its pretrained.pt, for the demos (launch/demo.py), the benchmarks (bench/), the GPU pass
(bench/e2e_overhead.py) and tests/helpers' ``Tiny``; the GPU pass's masked-LM start; the EWC demo's F of the
pretraining objective. The shared flags are the recipe's (launch/recipe.py), a method's the catalogue's.

Each caller passes what it varies. ``extra`` comes last: fairseq keeps a flag's last value, so a method's or a
test's flags (its --criterion, --arch) replace the shared ones."""

import os
from typing import List, Optional, Sequence

from recadam_fairseq.tiny.make_tiny_roberta import TINY_ARCH

from . import recipe

USER_DIR = os.path.join(recipe.REPO, "recadam_fairseq")
# roberta_base's shapes, spelled out (engine/methods.flags swaps --arch, ca_mtl_roberta's, and keeps them)
ARCH = {"base": ["--arch", "roberta", "--encoder-layers", "12", "--encoder-embed-dim", "768",
                 "--encoder-ffn-embed-dim", "3072", "--encoder-attention-heads", "12", "--max-positions", "512"],
        "tiny": TINY_ARCH}
MASKED_LM = ["--task", "masked_lm", "--criterion", "masked_lm"]


def encoder_layers(size: str) -> int:
    return int(ARCH[size][ARCH[size].index("--encoder-layers") + 1])


def classifier(criterion: str = "sentence_prediction") -> List[str]:
    """The generated set's two classes, learnt with ``criterion``."""
    return ["--task", "sentence_prediction", "--criterion", criterion, "--num-classes", "2"]


CLASSIFIER = classifier()


def finetune(data: str, save_dir: str, *extra: str, pretrained: Optional[str] = None, user_dir: str = USER_DIR,
             task: Sequence[str] = CLASSIFIER, arch: Sequence[str] = TINY_ARCH, glue_recipe: bool = False,
             weight_decay: Optional[str] = None, precision: str = "fp32", optimizer: Sequence[str] = (),
             lr: str = "1e-4", updates: int = 12, batch_size: int = 16, seed: int = 1, cpu: bool = True,
             workers: int = 0, save: bool = False, validate: bool = False, log_format: str = "json",
             log_interval: int = 1, best: Optional[str] = None, probe: Optional[str] = None,
             tensorboard: Optional[str] = None) -> List[str]:
    """``fairseq-train``'s arguments: ``task`` on ``data`` with ``arch``, from ``pretrained`` (None: no
    --restore-file), ``optimizer`` (the method's flags) with Adam's betas and eps, a fixed ``lr`` for ``updates``
    updates. ``glue_recipe``: RoBERTa's GLUE settings (dropout 0.1, batches of any size, weight decay 0.1, no
    clipping); ``weight_decay``: a decay alone; ``precision``: recipe.PRECISION's. ``save``: the last and best
    checkpoints (else nothing); ``best``: the metric of the best one; ``probe``: the forgetting meter's probe;
    ``tensorboard``: its log directory."""
    settings = [*recipe.DROPOUT, *recipe.ANY_BATCH, *recipe.weight_decay("0.1", clip="0.0")] if glue_recipe else []
    settings += recipe.weight_decay(weight_decay) if weight_decay else []
    return [str(data), "--user-dir", user_dir, *(recipe.restore(pretrained) if pretrained else []), *task,
            *recipe.TOKENS, *arch, *settings, *recipe.PRECISION[precision], "--batch-size", str(batch_size), *optimizer,
            *recipe.adam("1e-6"), *recipe.fixed(lr, updates), "--seed", str(seed), *recipe.device(cpu, workers),
            *(["--no-epoch-checkpoints"] if save else ["--no-save"]),
            "--save-dir", str(save_dir), *([] if validate else ["--disable-validation"]),
            *recipe.log(log_interval, log_format), *(recipe.best_checkpoint(best) if best else []),
            *(["--forgetting-probe", probe] if probe else []),
            *(["--tensorboard-logdir", tensorboard] if tensorboard else []), *extra]


def masked_lm_start(data: str, save_dir: str, size: str, tokens: int, seed: int, cpu: bool,
                    precision: str) -> List[str]:
    """One masked-LM update of Adam from random weights (the GPU pass's "pretrained" model), no validation."""
    return [data, *MASKED_LM, *ARCH[size], "--tokens-per-sample", str(tokens), "--batch-size", "8",
            "--optimizer", "adam", *recipe.fixed("1e-4", 1), "--seed", str(seed), *(["--cpu"] if cpu else []),
            *recipe.PRECISION[precision], "--num-workers", "0", "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--disable-validation", "--log-format", "simple"]


def masked_lm_fisher(tiny_dir: str, out: str) -> List[str]:
    """scripts/fisher.py's command: F of the masked-LM objective on the pretraining text, at θ* (every example)."""
    train = [os.path.join(tiny_dir, "lm-bin"), *MASKED_LM, *TINY_ARCH, "--tokens-per-sample", "64",
             "--batch-size", "16", "--restore-file", os.path.join(tiny_dir, "pretrained.pt"), "--user-dir", USER_DIR,
             "--cpu"]
    return recipe.fisher_command(out, 0, train)
