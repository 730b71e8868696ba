"""EWC's Fisher file: the empirical Fisher of a task's training set at the pretrained weights, written once
and reused by every run (``--ewc-fisher FILE``).

    python scripts/fisher.py --out rte-fisher.pt --examples 1024 -- RTE-bin/ --task sentence_prediction \\
        --criterion sentence_prediction --num-classes 2 --init-token 0 --separator-token 2 \\
        --restore-file roberta.base/model.pt --batch-size 16 --user-dir recadam_fairseq

After ``--`` come fairseq-train's own flags (data, task, criterion, --restore-file: the weights θ*, --batch-size,
--seed); the architecture and its sizes are the checkpoint's unless ``--arch`` is given (a wrong one: one
line). F is (1/N)·Σ_i g_i² over the first N examples (``--examples``, 0: all) of the training set in fairseq-train's
epoch-1 order, in eval mode, in fp32, exactly as ``--ewc-fisher task``
computes it before update 1 (``fisher_source.task_fisher``). With ``--task masked_lm --criterion
masked_lm`` on held-out text (``--train-subset valid``) it is F of the pretraining objective (docs/ewc.md).
The file holds F un-normalised; a run normalises it to mean 1 over its anchored parameters. The pass says how
far it is every tenth of its examples (or 30 s). Bad input: one line on stderr, exit 1.
"""

import argparse
import contextlib
import logging
import sys
import warnings
from types import SimpleNamespace

import torch

from recadam_fairseq.core import ewc
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.plumbing.config import EWCHyperparams

FISHER_BATCH = EWCHyperparams.ewc_fisher_batch_size  # fairseq-train's default


def with_checkpoint_arch(fairseq_args):
    """fairseq-train's flags with the --restore-file checkpoint's architecture (and max positions) first when they
    give no --arch, as the task scripts read it; a file that is not read (refused, cut short, not fairseq's) or an
    --arch that does not build its tensors is a one-line error."""
    from recadam_fairseq.core import checkpoint_file
    from recadam_fairseq.plumbing.restore_check import named
    from recadam_fairseq.tools import checkpoint_arch

    restore = named(fairseq_args).get("--restore-file")
    if not restore or restore == "checkpoint_last.pt":
        raise ConfigError("give the pretrained weights θ* with --restore-file PRETRAINED.pt (after --)")
    what = f"--restore-file {restore}"
    state = checkpoint_file.fairseq_state(restore, what)
    arch = next((a.split("=", 1)[1] if "=" in a else fairseq_args[i + 1] for i, a in enumerate(fairseq_args)
                 if a.split("=", 1)[0] in ("--arch", "-a") and ("=" in a or i + 1 < len(fairseq_args))), None)
    given = {a.split("=", 1)[0] for a in fairseq_args}
    try:
        if arch is not None:  # its sizes given too: the load below says what does not fit
            sized = given & {"--encoder-layers", "--encoder-embed-dim"}
            why = None if sized else checkpoint_arch.mismatch(checkpoint_arch.model_config(state), arch, what,
                                                              "--arch ", "leave --arch out")
            if why:
                raise ConfigError(why)
            return list(fairseq_args)
        sizes = checkpoint_arch.size_flags(state, what)
    except checkpoint_arch.ArchError as e:
        raise ConfigError(f"{e}: give --arch and its size flags") from None
    positions = [] if sizes["seq2seq"] or "--max-positions" in given else ["--max-positions", str(sizes["max_positions"])]
    return ["--arch", sizes["arch"], *sizes["flags"], *positions, *fairseq_args]


def setup(fairseq_args):
    """(cfg, task, model with --restore-file's weights, criterion) as fairseq-train builds them; the architecture
    the checkpoint's unless --arch is given."""
    import numpy as np
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import recadam_fairseq

    recadam_fairseq.register()
    import recadam_fairseq.safe_globals  # noqa: F401 - fairseq's checkpoints hold argparse/omegaconf objects

    fairseq_args = with_checkpoint_arch(fairseq_args)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), fairseq_args))
    restore = cfg.checkpoint.restore_file
    # seeded as fairseq-train seeds before building the model: a new head (the classifier's, which θ* lacks)
    # starts as that run's, so F equals its --ewc-fisher task at the same --seed
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    state = checkpoint_utils.load_checkpoint_to_cpu(restore)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as e:  # the sizes the flags give differ from the checkpoint's: its first mismatch
        first = next((ln.strip().rstrip(".") for ln in str(e).splitlines()[1:] if ln.strip()), str(e)[:200])
        raise ConfigError(f"--restore-file {restore}: the checkpoint does not fit the model the flags build ({first}); "
                          f"leave --arch and the size flags out to take the checkpoint's") from None
    if torch.cuda.is_available() and not cfg.common.cpu:
        model, criterion = model.cuda(), criterion.cuda()
    return cfg, task, model, criterion


def batches_cfg(cfg):
    """The fields ``train_batches`` reads (config.TrainBatches'), from fairseq-train's config."""
    d = cfg.dataset
    return SimpleNamespace(train_subset=d.train_subset, max_tokens=d.max_tokens, batch_size=d.batch_size,
                           required_batch_size_multiple=d.required_batch_size_multiple, num_workers=d.num_workers,
                           seed=cfg.common.seed)


@contextlib.contextmanager
def terminal():
    """What the terminal shows: the pass's progress lines (fisher_source.Progress) and errors; fairseq's INFO lines
    and Hydra's deprecation warnings (fairseq's config composition, not the user's doing) are left out."""
    say = logging.StreamHandler(sys.stderr)
    say.setFormatter(logging.Formatter("fisher.py: %(message)s"))
    source_log, root = logging.getLogger("recadam_fairseq.criterions.fisher_source"), logging.getLogger()
    saved = (source_log.level, source_log.propagate, root.level)
    source_log.addHandler(say)
    source_log.setLevel(logging.INFO)
    source_log.propagate = False
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        source_log.removeHandler(say)
        source_log.setLevel(saved[0])
        source_log.propagate = saved[1]
        root.setLevel(saved[2])


def main(argv=None) -> int:
    from recadam_fairseq.criterions.fisher_source import task_fisher

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s --out FILE "
                                     "[--examples N] -- FAIRSEQ-TRAIN-ARGS")
    parser.add_argument("--out", required=True, help="the Fisher file to write")
    parser.add_argument("--examples", type=int, default=1024, help="N examples (0: the whole training set)")
    parser.add_argument("--fisher-batch-size", type=int, default=FISHER_BATCH,
                        help="per-example gradients taken this many at a time (memory: one gradient of the model's "
                             "size per example, and their activations; 0: one at a time), as fairseq-train's "
                             "--ewc-fisher-batch-size")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    with terminal():
        try:
            if args.examples < 0:
                raise ConfigError(f"--examples {args.examples}: must be >= 0 (0: the whole training set)")
            if args.fisher_batch_size < 0:
                raise ConfigError(f"--fisher-batch-size {args.fisher_batch_size}: must be >= 0 (0: one at a time)")
            if split == len(argv):
                raise ConfigError("fairseq-train's flags (data, --task, --restore-file, ...) go after --")
            cfg, task, model, criterion = setup(argv[split + 1:])
            fisher, n = task_fisher(criterion, model, batches_cfg(cfg), args.examples, args.fisher_batch_size,
                                    "--fisher-batch-size")
        except ConfigError as e:
            print(f"fisher.py: error: {e}", file=sys.stderr)
            return 1
    ewc.save(args.out, fisher, n, f"empirical Fisher of {n} examples of {cfg.task.data} "
                                  f"({cfg.dataset.train_subset}) at {cfg.checkpoint.restore_file}")
    print(f"wrote {args.out}: F of {len(fisher)} tensors from {n} examples")
    return 0
