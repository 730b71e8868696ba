"""What the launcher's commands share: fp16 or not, the model's architecture from the checkpoint, the forgetting
meter's flags, the warnings for a run that cannot learn and the method's part (catalogue.py through prelaunch.py); the
flags the task scripts, the comparisons (launch/comparison.py) and the tiny model's runs (launch/tiny_train.py) write
alike, and scripts/fisher.py's command."""

import functools
import os
import sys
from typing import List, Optional, Tuple

from recadam_fairseq import catalogue
from recadam_fairseq.launch import prelaunch

from .spec import Stop
from .variables import Variables

ADAM = ["--adam-betas", "(0.9, 0.98)"]
FP16_FLAGS = ["--fp16", "--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128"]
# fairseq's precisions by name (the GPU pass's --precision); fp32: none
PRECISION = {"fp16": ["--fp16"], "bf16": ["--bf16"], "fp32": [], "memory-efficient-fp16": ["--memory-efficient-fp16"],
             "amp": ["--amp"]}
TOKENS = ["--init-token", "0", "--separator-token", "2"]  # RoBERTa's <s> and </s>
DROPOUT = ["--dropout", "0.1", "--attention-dropout", "0.1"]  # RoBERTa's fine-tuning recipe
ANY_BATCH = ["--required-batch-size-multiple", "1"]  # (fairseq's default rounds a batch to a multiple of 8)
RESET = ["--reset-optimizer", "--reset-dataloader", "--reset-meters"]  # weights only from the checkpoint
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
FISHER = os.path.join(REPO, "scripts", "fisher.py")


def adam(eps: str) -> List[str]:
    return [*ADAM, "--adam-eps", eps]


def weight_decay(decay: str, clip: Optional[str] = None) -> List[str]:
    """AdamW's decay, and the gradient's norm clipped at ``clip`` (0.0: never; None: fairseq's default)."""
    return ["--weight-decay", decay] + (["--clip-norm", clip] if clip is not None else [])


def restore(pretrained: str) -> List[str]:
    """Start from ``pretrained``'s weights, with a new optimizer, data loader and meters."""
    return ["--restore-file", pretrained, *RESET]


def polynomial(lr: str, total: int, warmup: int) -> List[str]:
    """``lr`` after ``warmup`` updates, decaying to 0 at ``total``, the run's end."""
    return ["--lr", lr, "--lr-scheduler", "polynomial_decay", "--total-num-update", str(total),
            "--warmup-updates", str(warmup), "--max-update", str(total)]


def fixed(lr: str, updates: int) -> List[str]:
    return ["--lr", lr, "--lr-scheduler", "fixed", "--max-update", str(updates)]


def device(cpu: bool, workers: int = 0) -> List[str]:
    """On the CPU (else fairseq's choice), the batches read by ``workers`` processes (0: the trainer itself)."""
    return (["--cpu"] if cpu else []) + ["--num-workers", str(workers)]


def best_checkpoint(metric: str) -> List[str]:
    """checkpoint_best.pt: the validation with the highest ``metric``."""
    return ["--best-checkpoint-metric", metric, "--maximize-best-checkpoint-metric"]


def log(interval, form: str = "json") -> List[str]:
    return ["--log-format", form, "--log-interval", str(interval)]


def fisher_command(out: str, examples, train: List[str], python: Optional[str] = None,
                   script: str = FISHER) -> List[str]:
    """scripts/fisher.py's command: EWC's F at θ* of fairseq-train's arguments ``train`` (its data, task, criterion,
    --restore-file), over ``examples`` of them (0: all), into ``out``."""
    return [python or sys.executable, script, "--out", out, "--examples", str(examples), "--", *train]


def method(v: Variables, name: str, multitask: bool = False, seq2seq: bool = False) -> dict:
    """The method's part of the command (prelaunch.method_plan), its knobs from their variables; an EWC_FISHER file
    read for its form before any run directory is made."""
    plan = prelaunch.method_plan(name, v.env, multitask, seq2seq)
    fisher = plan.get(catalogue.KNOBS["fisher"].var, "task")
    if fisher != "task":
        fisher_file(fisher, os.path.getmtime(fisher))
    return plan


@functools.lru_cache(maxsize=None)
def fisher_file(path: str, mtime: float) -> None:
    """EWC_FISHER's file read for its form (once a file, for a grid's runs)."""
    prelaunch.need("torch")
    from recadam_fairseq.core.errors import ConfigError

    try:
        prelaunch.need("recadam_fairseq.core.ewc").load(path, mmap=True, what=f"EWC_FISHER={path}")
    except ConfigError as e:
        raise Stop(str(e)) from None


def checkpoint_arch(v: Variables, path: Optional[str], what: str, seq2seq: bool = False) -> dict:
    """The checkpoint's architecture (CKPT_ARCH, CKPT_ARCH_FLAGS, CKPT_MAX_POSITIONS, CKPT_LAYERS); ARCH checked
    against it. A dry run goes on without it (a warning) when the checkpoint cannot be read."""
    try:
        return dict(_arch_of(path, os.path.getmtime(path), f"{what}={path}", v.get("ARCH", ""), seq2seq))
    except Stop as e:
        if not (v.dry_run and str(e).startswith(f"{what}=")):  # an ARCH the checkpoint does not hold stops a dry run too
            raise
        v.say(f"warning: {e}")  # a checkpoint not read: a dry run only writes the command
        return {}


@functools.lru_cache(maxsize=None)
def _arch_of(path, mtime, what, arch, seq2seq):
    """prelaunch.arch_of, once a checkpoint (a grid's runs share it)."""
    from recadam_fairseq.tools.checkpoint_arch import SEQ2SEQ_SIZE_KEYS

    return tuple(prelaunch.arch_of(path, what, arch, SEQ2SEQ_SIZE_KEYS if seq2seq else None).items())


def fp16(v: Variables, choice: str) -> bool:
    """FP16 auto|0|1 -> fp16 or not; fp16 is never asked of a machine without CUDA."""
    if choice == "0" or (choice == "1" and v.dry_run):
        return choice == "1"
    cuda = v.cuda if v.cuda is not None else bool(prelaunch.has_cuda())
    if choice == "auto":
        if not cuda:
            v.say("no CUDA device here: training in fp32 (FP16=0)")
        return cuda
    if not cuda:
        raise Stop("FP16=1 needs a CUDA device and torch sees none here: use FP16=0 (fp32)")
    return True


def arch_flags(v: Variables, ckpt: dict, default: str, arch: Optional[str] = None) -> Tuple[List[str], int]:
    """(--arch and its sizes, MAX_POSITIONS): ``arch`` (ARCH) if given, else the checkpoint's, else (a dry run
    without a readable checkpoint) --arch ``default``."""
    arch = arch or v.get("ARCH")
    if arch:
        flags = ["--arch", arch]
    elif ckpt.get("CKPT_ARCH"):
        flags = ["--arch", ckpt["CKPT_ARCH"]] + ckpt["CKPT_ARCH_FLAGS"].split()
    else:
        flags = ["--arch", default]
    return flags, v.whole("MAX_POSITIONS", ckpt.get("CKPT_MAX_POSITIONS", 512))


def schedule_warnings(v: Variables, end: int, warmup: int, lr: str, recadam: bool) -> None:
    """A line each for a run that cannot learn: a warmup not shorter than the run, RecAdam's T0 at or past its end."""
    if warmup >= end:
        v.say(f"warning: the warmup ({warmup} updates) is not shorter than the run ({end} updates): the lr never "
              f"reaches LR={lr}")
    t0 = v.get("T0", catalogue.KNOBS["t0"].default)
    if recadam and float(t0) >= end:
        v.say(f"warning: T0={t0} is not before the run's end ({end} updates): λ(t) stays below 1/2, so RecAdam "
              f"barely moves the encoder; give T0 < {end}")


def forgetting(v: Variables, metric: str) -> Tuple[List[str], str]:
    """(the meter's flags, the --best-checkpoint-metric): FORGETTING_PROBE=DIR and FORGETTING_METER [mlm] | pairs;
    FORGETTING_BUDGET=X: the best validation among those that forgot at most X (fgt_budget_METRIC)."""
    probe, meter, budget = v.get("FORGETTING_PROBE"), v.get("FORGETTING_METER"), v.get("FORGETTING_BUDGET")
    if not probe:
        for name, value in (("FORGETTING_METER", meter), ("FORGETTING_BUDGET", budget)):
            if value:
                raise Stop(f"{name}={value} needs FORGETTING_PROBE=DIR (scripts/binarize_probe.py)")
        return [], metric
    meter = v.choice("FORGETTING_METER", "mlm", ["mlm", "pairs"], "FORGETTING_METER must be mlm or pairs, got '{value}'")
    if not v.dry_run and not os.path.isdir(probe):
        raise Stop(f"FORGETTING_PROBE={probe}: no such directory (write it with scripts/binarize_probe.py)")
    flags = ["--forgetting-probe", probe, "--forgetting-meter", meter]
    if not budget:
        return flags, metric
    v.number("FORGETTING_BUDGET", "the most a validation may forget")
    return flags + ["--forgetting-budget", budget], f"fgt_budget_{metric}"


def tail(v: Variables, run_dir: str, seed: int, save_interval: int, best: str, log_interval: str = "100") -> List[str]:
    """The flags every task script ends with: the checkpoint rule, the seed, the run directory and the log."""
    return [*best_checkpoint(best), "--seed", str(seed), "--save-dir", run_dir, "--no-epoch-checkpoints",
            "--save-interval-updates", str(save_interval), "--keep-interval-updates", "1", *log(log_interval)]
