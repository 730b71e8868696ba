"""Where EWC's Fisher F comes from in a fairseq run (``--ewc-fisher``).

- ``--ewc-fisher task``: the empirical Fisher (1/N)·Σ_i g_i² of the training set at θ*, from per-example
  gradients of N examples (``--ewc-fisher-examples`` per rank, fairseq's batches in epoch-1 order, as
  ChildTuning-D's passes take them: ``plumbing/batches.train_batches``; ``--ewc-fisher-batch-size`` of them a
  vmap, ``core/per_example.py``), computed at the criterion's first training call, before update 1. The
  model is in eval mode (no dropout: F of θ*'s function, not of a dropout draw); the RNG and the gradients
  are left as they were. Ranks' sums are added.
- ``--ewc-fisher PATH``: a file of ``scripts/fisher.py`` (the same passes, once, reused across runs; with
  fairseq's ``masked_lm`` on held-out text, F of the pretraining objective).

F is laid out as θ* by its users: ``--optimizer recadam`` (``optim/fairseq_recadam.py``'s ``Anchoring``) and
the coupled objective (``criterions/coupled_term.py``). The math (sums, checks, normalisation) is ``core/ewc.py``.
"""

import contextlib
import logging
import time
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils

from ..core import ewc
from ..core.anchor import trainable_named_parameters
from ..core.errors import ConfigError
from ..core.per_example import rows
from ..core.wrappers import unwrap_model
from ..plumbing.batches import prepare, train_batches
from ..plumbing.config import FISHER_DTYPES
from .glue_core import criterion_name, per_example_loss_of

logger = logging.getLogger(__name__)

FP16_SCALE = 2.0 ** 16  # first loss scale of fp16 per-example gradients; halved on overflow
BATCH_COUNTS = ("ntokens", "nsentences")  # a batch's counts: not read by the losses, not the batched pass's key
PROGRESS_SECONDS = 30.0  # the pass says how far it is every tenth of its examples, or this often


class Progress:
    """One log line per tenth of the pass's examples, or every PROGRESS_SECONDS (a pass on a CPU thread may take
    many minutes): ``ewc: the Fisher pass: 102/1024 examples (10%), 118 s, about 1060 s left``."""

    def __init__(self, total: int):
        self.total, self.start = max(int(total), 1), time.perf_counter()
        self.next, self.last = self.total / 10, self.start

    def tick(self, done: int) -> None:
        now = time.perf_counter()
        if done < self.next and now - self.last < PROGRESS_SECONDS or done >= self.total:
            return
        while self.next <= done:
            self.next += self.total / 10
        self.last, took = now, now - self.start
        logger.info(f"ewc: the Fisher pass: {done}/{self.total} examples ({100 * done // self.total}%), {took:.0f} s, "
                    f"about {took * (self.total - done) / max(done, 1):.0f} s left")


_read_by_optimizer = False  # this process built an optimizer that weighs its pull by F (--optimizer recadam)


def optimizer_reads_it() -> None:
    global _read_by_optimizer
    _read_by_optimizer = True


def check_read(flag: str) -> None:
    """At the first training call (fairseq builds the optimizer before it): the decoupled objective leaves F
    to the optimizer; when it is not --optimizer recadam, nothing would read F."""
    if not _read_by_optimizer:
        raise ConfigError(f"--ewc-fisher {flag}: with --recadam-objective decoupled F weighs --optimizer recadam's "
                          f"pull, and this optimizer has none, so F would be ignored; use --optimizer recadam or "
                          f"--recadam-objective coupled")


def enabled(cfg) -> bool:
    return bool(getattr(cfg, "ewc_fisher", ""))


def fisher_dtype(cfg) -> torch.dtype:
    return getattr(torch, FISHER_DTYPES[str(cfg.ewc_fisher_dtype)])


def check_flags(cfg) -> None:
    if int(cfg.ewc_fisher_examples) < 0:
        raise ConfigError(f"--ewc-fisher-examples {cfg.ewc_fisher_examples}: must be >= 0 (0: the whole training set)")
    if int(cfg.ewc_fisher_batch_size) < 0:
        raise ConfigError(f"--ewc-fisher-batch-size {cfg.ewc_fisher_batch_size}: must be >= 0 (0: one example at a "
                          f"time)")


def masked_lm_per_example(criterion, every_position: bool = False):
    """``f(model, sample)``: fairseq's ``masked_lm`` loss, one value per example (the sum over its masked
    tokens; their sum is the criterion's), or None for another criterion. F of the pretraining objective on
    held-out text (``scripts/fisher.py --task masked_lm --criterion masked_lm``). The LM head runs on the masked
    positions, as the criterion's; ``every_position``: on all of them (the same losses, shapes that do not depend
    on the data: the batched pass's trace, whose memory grows with it)."""
    from fairseq.criterions.masked_lm import MaskedLmLoss

    if not isinstance(criterion, MaskedLmLoss):
        return None

    def per_example(model, sample):
        target = sample["target"]
        if every_position:
            logits = model(**sample["net_input"])[0]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                                                    reduction="none", ignore_index=criterion.padding_idx)
            return nll.view(target.shape).sum(-1)
        masked = target.ne(criterion.padding_idx)
        logits = model(**sample["net_input"], masked_tokens=masked)[0]
        nll = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), target[masked],
                                                reduction="none")
        rows = masked.nonzero()[:, 0]  # the example of each masked token
        return torch.zeros(masked.size(0), dtype=nll.dtype, device=nll.device).index_add(0, rows, nll)

    return per_example


def seq2seq_per_example(criterion):
    """``f(model, sample)``: the negative log-likelihood of each target sentence (the sum over its tokens,
    without label smoothing: the empirical Fisher of the model's own likelihood) for fairseq's
    ``label_smoothed_cross_entropy`` and the plug-in's criteria built on it, or None for another criterion.
    F of the pretraining domain's translation objective (``scripts/fisher.py --task translation``)."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    if not isinstance(criterion, LabelSmoothedCrossEntropyCriterion):
        return None

    def per_example(model, sample):
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
        target = sample["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return nll.masked_fill(target.eq(criterion.padding_idx), 0.0).sum(-1)

    return per_example


def bucket(length: int) -> int:
    """The padded length of a batch of ``length`` tokens: the next of 16, 24, 32, 48, 64, 96, ... (powers of two
    and 1.5 times them) above it: one pad or more in every example, at most 1.5 times the tokens, a few lengths so a
    few traces of the batched pass."""
    n = 16
    while n <= length:
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3
    return n


def _padded(x: torch.Tensor, length: int, pad: int, left: bool = False) -> torch.Tensor:
    extra = length - x.size(1)
    return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=pad) if extra > 0 else x


def padder(criterion, seq2seq: bool):
    """``pad(sample)`` for the batched pass: the token tensors padded with the dictionaries' pad to the bucket of
    their length, on the side the task pads them (a translation source: --left-pad-source)."""
    task = criterion.task
    src_pad = task.source_dictionary.pad()

    def pad(sample):
        inp = dict(sample["net_input"])
        tokens = inp["src_tokens"]
        inp["src_tokens"] = _padded(tokens, bucket(tokens.size(1)), src_pad,
                                    left=seq2seq and bool(getattr(task.cfg, "left_pad_source", False)))
        out = {**sample, "net_input": inp}
        target = sample.get("target")
        if seq2seq:  # the decoder's input and the target: right-padded, one length
            tgt_pad, n = task.target_dictionary.pad(), bucket(inp["prev_output_tokens"].size(1))
            inp["prev_output_tokens"] = _padded(inp["prev_output_tokens"], n, tgt_pad)
            out["target"] = _padded(target, n, tgt_pad)
        elif target is not None and target.dim() == 2 and target.shape == tokens.shape:  # masked LM: per token
            out["target"] = _padded(target, inp["src_tokens"].size(1), criterion.padding_idx)
        return out

    return pad


@contextlib.contextmanager
def named_errors(batch: int, flag: str):
    """The pass's failures, named by their flag: out of memory with per-example gradients ``batch`` at a time
    (``flag``: the option that sets it; one line), an fp16 gradient that overflows at every loss scale."""
    from ..core.per_example import ChunkOutOfMemory

    try:
        yield
    except ChunkOutOfMemory:
        raise ConfigError(f"{flag} {batch}: out of memory taking {batch} per-example gradients at once (each the "
                          f"model's size, and the chunk's activations); lower it (0: one at a time)") from None
    except FloatingPointError as e:
        raise FloatingPointError(f"{ewc.FLAG} {ewc.TASK}: {e}") from None


def task_fisher(criterion, model: torch.nn.Module, cfg, examples: int, batch: int = 16,
                batch_flag: str = "--ewc-fisher-batch-size") -> Tuple[Dict[str, torch.Tensor], int]:
    """{name: (1/N)·Σ_i g_i²} over the model's trainable parameters, N = the examples taken (``examples`` per
    rank, 0: all), summed over ranks; and N. ``batch``: per-example gradients taken that many at a time (0: one
    at a time; ``batch_flag`` names it in an error)."""
    inner = unwrap_model(model)
    seq2seq = seq2seq_per_example(criterion)
    loss_fn = per_example_loss_of(criterion) or masked_lm_per_example(criterion) or seq2seq
    if loss_fn is None:
        raise ConfigError(f"--ewc-fisher task: --criterion {criterion_name(criterion)} gives no per-example loss; use "
                          f"a GLUE criterion (sentence_prediction, sentence_prediction_recadam, glue_multitask), "
                          f"masked_lm, label_smoothed_cross_entropy (translation), or a Fisher file of scripts/fisher.py")
    mlm = per_example_loss_of(criterion) is None and seq2seq is None
    named = trainable_named_parameters(inner)
    world, rank, group = 1, 0, None
    if dist.is_available() and dist.is_initialized():
        group = distributed_utils.get_data_parallel_group()
        world, rank = distributed_utils.get_world_size(group), distributed_utils.get_rank(group)
    device, dtype = named[0][1].device, named[0][1].dtype
    fisher = ewc.FisherPass(inner, loss_fn, named, batch, pad=padder(criterion, seq2seq is not None),
                            scale=FP16_SCALE if dtype == torch.float16 else 1.0,
                            traced=masked_lm_per_example(criterion, every_position=True) if mlm else None,
                            say=lambda why: logger.info(f"ewc: the Fisher pass takes the per-example gradients {why}"))
    shard = -(-len(criterion.task.dataset(cfg.train_subset)) // world)  # this rank's share of the split
    progress = Progress(min(examples, shard) if examples else shard)  # what the pass will see, not the flag's N
    was_training = inner.training
    inner.eval()
    try:
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []), \
                named_errors(batch, batch_flag):
            for sample in train_batches(cfg, criterion.task, inner, world, rank):
                if examples and fisher.examples >= examples:
                    break
                if not sample or mlm and not bool(sample["target"].ne(criterion.padding_idx).any()):
                    continue  # an empty batch (the shards evened out); masked_lm: a batch without a masked token
                sample = prepare(sample, device, dtype)
                n = len(sample["id"])
                take = min(n, examples - fisher.examples) if examples else n
                view = {k: v for k, v in sample.items() if k not in BATCH_COUNTS}
                fisher.add(rows(view, n, 0, take), take, progress.tick)
    finally:
        inner.train(was_training)
    count = torch.tensor([float(fisher.examples)], dtype=torch.float64, device=device)
    if world > 1:
        for s in fisher.sums.sums:
            distributed_utils.all_reduce(s, group=group)
        distributed_utils.all_reduce(count, group=group)
    n = int(count.item())
    return {name: s / max(n, 1) for (name, _), s in zip(named, fisher.sums.sums)}, n


def pieces(anchors):
    """(θ elements, θ* of them) per anchored piece of build_anchors' [(tensor, anchor or None, runs or None)]."""
    for t, a, runs in anchors:
        if a is None:
            continue
        flat, off = t.detach().reshape(-1), 0
        for s, n in runs or [(0, t.numel())]:
            yield flat[s:s + n], a.reshape(-1)[off:off + n]
            off += n


def check_at_theta_star(pairs, where: str) -> None:
    """``task``'s F is of the weights the passes saw: they must be θ* (not so when θ* comes from
    --recadam-pretrained-path over other weights, e.g. a random init or a resumed coupled run). A half-precision
    θ* matches to its rounding."""
    for x, a in pairs:
        same = (torch.equal(x, a) if x.dtype == a.dtype
                else torch.allclose(x.float(), a.float(), rtol=2.0 ** -7, atol=0.0))
        if not same:
            raise ConfigError(f"{where}: the Fisher passes saw weights other than θ* (θ* from --recadam-pretrained-path "
                              f"over another model, or a resumed run): write F at θ* once with scripts/fisher.py and "
                              f"pass the file")


class FisherSource:
    """F for a run: the file read at construction (a bad file fails before training), or the task's passes
    at the criterion's first training call (``compute``); ``normalised`` checks and normalises it."""

    def __init__(self, cfg):
        self.cfg = cfg
        check_flags(cfg)
        self.raw: Optional[Dict[str, torch.Tensor]] = None
        self.line = ""
        self.skip = False  # a resumed run: F comes from the checkpoint's optimizer state
        self.computed = False  # F of the weights the passes saw (``task``)
        if cfg.ewc_fisher != ewc.TASK:
            self.raw, self.line = ewc.load(cfg.ewc_fisher)
            self.where = f"{ewc.FLAG} {cfg.ewc_fisher}"
        else:
            self.where = f"{ewc.FLAG} {ewc.TASK}"

    def compute(self, criterion, model) -> None:
        """The task's Fisher, once (``--ewc-fisher task``); nothing for a file."""
        if self.raw is None:
            start = time.perf_counter()
            self.raw, n = task_fisher(criterion, model, self.cfg, int(self.cfg.ewc_fisher_examples),
                                      int(self.cfg.ewc_fisher_batch_size))
            if n == 0:
                raise ConfigError(f"{self.where}: the training set gave no example")
            # (task_fisher ends on a host read of the count: the device's work is done)
            logger.info(f"ewc: the Fisher pass took {time.perf_counter() - start:.1f} s ({n} per-example "
                        f"gradients, before update 1)")
            self.line = f"{self.where} (empirical Fisher of {n} training examples at θ*)"
            self.computed = True

    def normalised(self, model, anchored, keep=None) -> Dict[str, torch.Tensor]:
        """F of the anchored parameters, checked against ``model`` and normalised to mean 1 over them; only those
        in ``keep`` (a ZeRO rank's shard) when given."""
        if self.raw is None:
            raise RuntimeError(f"{self.where}: F is computed at the criterion's first training call, before the "
                               f"first gradient reduction")
        shapes = {n: tuple(p.shape) for n, p in trainable_named_parameters(unwrap_model(model))}
        ewc.check(self.raw, shapes, anchored, self.where)
        f, mean = ewc.normalise(self.raw, list(anchored), self.where, keep)
        raw = [self.raw[n] for n in anchored]  # the whole F's figures, whatever this rank keeps
        top, zeros = max(float(x.max()) for x in raw), sum(int((x == 0).sum()) for x in raw)
        logger.info(f"ewc: F from {self.line}: {len(raw)} tensors, normalised by its mean {mean:.4g}; max/mean "
                    f"{top / mean:.4g}, zero on {zeros:,} of {sum(x.numel() for x in raw):,} elements")
        self.raw = None  # the normalised copy is what is used
        return f
