"""The comparisons' runs: the forgetting comparison's fairseq-train command (scripts/forgetting/run.py;
compare/runner.py runs it), the translation comparison's runs (scripts/seq2seq/compare.py: seq2seq/finetune.sh's
RunSpec of launch/translation.py, trained in-process) and its fairseq-validate, the Fisher pass of each
(scripts/fisher.py, recipe.fisher_command).

A recorded run is reused while its command is the same, so a change here shows in tests/test_forgetting.py against
the commands docs/forgetting*.json recorded (tests/test_seq2seq_comparison.py: docs/seq2seq-comparison.json's)."""

import dataclasses
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence

from recadam_fairseq import catalogue
from recadam_fairseq.engine import methods
from recadam_fairseq.engine.settings import fmt

from . import recipe, translation
from .spec import RunSpec
from .variables import Variables


@dataclass(frozen=True)
class Shared:
    """What every run of one forgetting comparison shares; paths as its commands name them."""

    user_dir: str
    pretrained: str  # --restore-file, θ*
    arch: Sequence[str]  # its architecture flags
    num_layers: int
    target: Optional[str]  # the target's binarized data (one task)
    glue: Optional[str]  # the glue_multitask layout of the target(s): freeze, ca-mtl, the multi-task setting
    num_classes: Optional[int]
    mt_task: str  # glue_multitask's --mt-tasks
    multitask: bool
    lr: float
    updates: int
    warmup: float  # a fraction of the updates
    batch_size: int
    log_interval: int
    cpu: bool
    fisher: Optional[str] = None  # EWC's Fisher file of the target data, for --ewc-fisher task


def train_argv(s: Shared, setting: dict, seed: int, save_dir: str, save_every: Optional[int] = None) -> List[str]:
    """The fairseq-train arguments of one run: one shared command, the method's flags on it (engine/methods.py);
    ``save_every``: a checkpoint every so many updates (the points measured along the run), else only the last."""
    f = methods.flags(setting, s.num_layers, s.mt_task, s.multitask)
    arch, task = methods.arch_and_task(f, s.arch, s.num_classes)
    cmd = [s.glue if f["task"] else s.target, "--user-dir", s.user_dir]
    # random init: θ* comes from the same checkpoint, for the pull
    cmd += recipe.restore(s.pretrained) if f["restore"] else ["--recadam-pretrained-path", s.pretrained, *recipe.RESET]
    cmd += [*task, *f["criterion"], *recipe.TOKENS, *arch, *recipe.DROPOUT,
            "--batch-size", str(s.batch_size), *recipe.ANY_BATCH, *f["optimizer"], *recipe.adam("1e-06"),
            *recipe.weight_decay("0.0", clip="0.0"),
            *recipe.polynomial(fmt(s.lr), s.updates, max(1, round(s.warmup * s.updates))), "--seed", str(seed),
            *f["extra"]]
    if save_every:
        # an interval save that lands on an epoch's end is an end-of-epoch save: fairseq writes it
        # as checkpoint<epoch>.pt, and only with --save-interval 1 and without --no-epoch-checkpoints
        # (else only checkpoint_last.pt, which the next save overwrites). collect() reads each file's
        # update count and fails when a requested one is missing.
        cmd += ["--save-interval-updates", str(save_every), "--keep-interval-updates", "-1", "--save-interval", "1"]
    else:
        cmd += ["--no-epoch-checkpoints", "--save-interval", "1000000"]
    # fairseq validates (on the held-out split) at the end and at each intermediate save;
    # checkpoints without optimizer state (measuring needs the weights only)
    cmd += [*recipe.device(s.cpu), "--save-dir", save_dir, "--no-save-optimizer-state", "--validate-interval",
            "1000000", *recipe.log(s.log_interval)]
    if s.fisher and (i := methods.task_fisher_at(cmd)) is not None:
        cmd[i] = s.fisher  # one F for every EWC run (compare/ewc_fisher.py)
    return cmd


# the translation comparison: fairseq-train's flags for every run (one CPU core's worth, a validation only at the end)
TRANSLATION_EXTRA = ("--num-workers", "0", "--validate-interval", "1000", "--save-interval", "1000")


def translation_run(v: Variables, method: str, knobs: Mapping[str, str], cwd: str) -> RunSpec:
    """seq2seq/finetune.sh METHOD's run under the variables ``v``, ``knobs``' flags (catalogue keys: values) and
    TRANSLATION_EXTRA after it, run in ``cwd`` (its paths are relative to it; so is the process's working
    directory, which its checks read)."""
    extra = [x for k, value in knobs.items() for x in catalogue.KNOBS[k].flags(value)] + list(TRANSLATION_EXTRA)
    return dataclasses.replace(translation.build(v, method, extra), cwd=cwd)


PAIR = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]  # make_text_translation.py's


def translation_fisher(a_bin: str, pretrained: str, arch: Sequence[str], out: str, examples: int,
                       script: str = recipe.FISHER) -> List[str]:
    """scripts/fisher.py's command: F of the pretraining domain's translation objective at θ*."""
    train = [a_bin, *PAIR, *arch, "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--restore-file", pretrained, "--batch-size", "16", *recipe.device(True), "--user-dir", "recadam_fairseq"]
    return recipe.fisher_command(out, examples, train, script=script)


def translation_validate(b_bin: str, checkpoint: str) -> List[str]:
    """fairseq-validate's arguments: BLEU (greedy) of ``checkpoint`` on the new domain (valid) and the old (test)."""
    return [b_bin, "--user-dir", "recadam_fairseq", *PAIR, "--path", checkpoint, *recipe.device(True),
            "--max-tokens", "2048", "--eval-bleu", "--eval-bleu-args", '{"beam": 1}', "--eval-bleu-detok", "space",
            "--valid-subset", "valid,test"]
