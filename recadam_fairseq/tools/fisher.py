"""EWC's Fisher file: the empirical Fisher of a task's training set at the pretrained weights, written once
and reused by every run (``--ewc-fisher FILE``).

    python scripts/fisher.py --out rte-fisher.pt --examples 1024 -- RTE-bin/ --task sentence_prediction \\
        --criterion sentence_prediction --num-classes 2 --init-token 0 --separator-token 2 --arch roberta_base \\
        --restore-file roberta.base/model.pt --batch-size 16 --user-dir recadam_fairseq

After ``--`` come fairseq-train's own flags (data, task, model, criterion, --restore-file: the weights θ*,
--batch-size, --seed): F is (1/N)·Σ_i g_i² over the first N examples (``--examples``, 0: all) of the
training set in fairseq-train's epoch-1 order, in eval mode, in fp32, exactly as ``--ewc-fisher task``
computes it before update 1 (``fisher_source.task_fisher``). With ``--task masked_lm --criterion
masked_lm`` on held-out text (``--train-subset valid``) it is F of the pretraining objective (docs/ewc.md).
The file holds F un-normalised; a run normalises it to mean 1 over its anchored parameters. Bad input:
one line on stderr, exit 1.
"""

import argparse
import sys
from types import SimpleNamespace

import torch

from recadam_fairseq.core import ewc
from recadam_fairseq.core.errors import ConfigError


def setup(fairseq_args):
    """(cfg, task, model with --restore-file's weights, criterion) as fairseq-train builds them."""
    import numpy as np
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import recadam_fairseq

    recadam_fairseq.register()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), fairseq_args))
    restore = cfg.checkpoint.restore_file
    if not restore or restore == "checkpoint_last.pt":
        raise ConfigError("give the pretrained weights θ* with --restore-file PRETRAINED.pt (after --)")
    # seeded as fairseq-train seeds before building the model: a new head (the classifier's, which θ* lacks)
    # starts as that run's, so F equals its --ewc-fisher task at the same --seed
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    import recadam_fairseq.safe_globals  # noqa: F401 - fairseq's checkpoints hold argparse/omegaconf objects

    state = checkpoint_utils.load_checkpoint_to_cpu(restore)
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    if torch.cuda.is_available() and not cfg.common.cpu:
        model, criterion = model.cuda(), criterion.cuda()
    return cfg, task, model, criterion


def batches_cfg(cfg):
    """The fields ``train_batches`` reads (config.TrainBatches'), from fairseq-train's config."""
    d = cfg.dataset
    return SimpleNamespace(train_subset=d.train_subset, max_tokens=d.max_tokens, batch_size=d.batch_size,
                           required_batch_size_multiple=d.required_batch_size_multiple, num_workers=d.num_workers,
                           seed=cfg.common.seed)


def main(argv=None) -> int:
    from recadam_fairseq.fisher_source import task_fisher

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s --out FILE "
                                     "[--examples N] -- FAIRSEQ-TRAIN-ARGS")
    parser.add_argument("--out", required=True, help="the Fisher file to write")
    parser.add_argument("--examples", type=int, default=1024, help="N examples (0: the whole training set)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    try:
        if args.examples < 0:
            raise ConfigError(f"--examples {args.examples}: must be >= 0 (0: the whole training set)")
        if split == len(argv):
            raise ConfigError("fairseq-train's flags (data, --task, --arch, --restore-file, ...) go after --")
        cfg, task, model, criterion = setup(argv[split + 1:])
        fisher, n = task_fisher(criterion, model, batches_cfg(cfg), args.examples)
    except ConfigError as e:
        print(f"fisher.py: error: {e}", file=sys.stderr)
        return 1
    ewc.save(args.out, fisher, n, f"empirical Fisher of {n} examples of {cfg.task.data} "
                                  f"({cfg.dataset.train_subset}) at {cfg.checkpoint.restore_file}")
    print(f"wrote {args.out}: F of {len(fisher)} tensors from {n} examples")
    return 0
