"""The fine-tuning command of a generated RoBERTa from its pretrained.pt (make_tiny_roberta.py's tiny one, or the GPU
pass's roberta-base shapes): one builder of the ``fairseq-train`` arguments for the benchmarks (scripts/benchmark.py,
scripts/bench_methods.py), the GPU pass (scripts/gpu/e2e_overhead.py) and the tests (tests/helpers' ``Tiny``).

Each caller passes what it varies. ``extra`` comes last: fairseq keeps a flag's last value, so a method's or a
test's flags (its --criterion, --arch) replace the shared ones."""

import os
from typing import List, Optional, Sequence

from recadam_fairseq.tiny.make_tiny_roberta import TINY_ARCH

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # recadam_fairseq
CLASSIFIER = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2"]
TOKENS = ["--init-token", "0", "--separator-token", "2"]  # RoBERTa's <s> and </s>


def restore(pretrained: str) -> List[str]:
    """Start from ``pretrained``'s weights, with a new optimizer, data loader and meters."""
    return ["--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters"]


def finetune(data: str, save_dir: str, *extra: str, pretrained: Optional[str] = None, user_dir: str = USER_DIR,
             task: Sequence[str] = CLASSIFIER, arch: Sequence[str] = TINY_ARCH, settings: Sequence[str] = (),
             optimizer: Sequence[str] = (), lr: str = "1e-4", updates: int = 12, batch_size: int = 16, seed: int = 1,
             cpu: bool = True, workers: int = 0, saves: Sequence[str] = ("--no-save",), validate: bool = False,
             log_format: str = "json", log_interval: int = 1) -> List[str]:
    """``fairseq-train``'s arguments: ``task`` on ``data`` with ``arch``, from ``pretrained`` (None: no
    --restore-file), ``optimizer`` with Adam's betas and eps, a fixed ``lr`` for ``updates`` updates; ``settings``:
    the caller's other fixed flags (dropout, precision, ...); ``saves``: what is saved (default: nothing)."""
    return [str(data), "--user-dir", user_dir, *(restore(pretrained) if pretrained else []), *task, *TOKENS, *arch,
            *settings, "--batch-size", str(batch_size), *optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
            "--lr", lr, "--lr-scheduler", "fixed", "--max-update", str(updates), "--seed", str(seed),
            *(["--cpu"] if cpu else []), "--num-workers", str(workers), *saves, "--save-dir", str(save_dir),
            *([] if validate else ["--disable-validation"]), "--log-format", log_format,
            "--log-interval", str(log_interval), *extra]
