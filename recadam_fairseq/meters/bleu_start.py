"""Forgetting in BLEU (``--eval-bleu-start``, with ``--eval-bleu`` on ``--task translation``): each valid subset's
BLEU at θ*, measured once before update 1, logged at every validation beside fairseq's ``bleu`` as ``bleu_start``,
with ``bleu_delta`` = ``bleu`` − ``bleu_start`` (on the original domain's subset, a negative delta is forgetting).

- θ*'s BLEU is fairseq's own: at the criterion's first training call, each subset of ``--valid-subset`` goes
  through ``task.valid_step`` (``--eval-bleu``'s generation and sacrebleu n-gram counts) and
  ``task.reduce_metrics`` (fairseq's ``bleu``, rounded to 2 decimals) in a throwaway metrics root, batched as
  fairseq's Trainer batches validation (``get_valid_iterator``'s settings), on the unwrapped model in eval mode;
  the modules' modes and the RNG states are put back (measuring.measuring), so training is unchanged.
- Every rank measures the whole subset (no sharding, no collective): the same numbers on every rank.
- Kept in ``SAVE_DIR/bleu_start.json`` with what it depends on (the pretrained file, the data, the subsets,
  the --eval-bleu settings): a resumed run reads it there and never recomputes it; a run resumed without it
  logs ``bleu`` alone (a warning says so).
- At each validation: ``events.on_validation`` marks the start of each subset's pass; fairseq's ``validate``
  runs the subsets in ``--valid-subset``'s order, every one at every validation, so the n-th pass since the
  update changed is the n-th subset that has a batch. ``bleu_delta`` is derived from fairseq's ``bleu`` when
  the logs are written (``metrics.log_derived``), as fairseq derives ``bleu`` itself.

Installed by ``meters.install`` from the plug-in's seq2seq criteria (``label_smoothed_cross_entropy_rdrop``, ``_r3f``,
``_recadam``: ``meters.InstallsWhenTraining``) when fairseq first puts them in training mode (not in fairseq-validate).
"""

import logging
import os
from typing import Dict, List, Optional

from fairseq import utils
from fairseq.logging import metrics

from ..core.errors import ConfigError
from ..core.wrappers import unwrap_model
from ..plumbing import events
from ..plumbing.metrics import BLEU_PASS_MARKER, log_bleu_start
from .measuring import measuring, updates_done, values_at_theta_star

logger = logging.getLogger(__name__)

STATE_FILE = "bleu_start.json"


def install(cfg, task) -> None:
    """Check the flags now (before training); measure θ*'s BLEU at the first training call."""
    if not getattr(cfg, "eval_bleu_start", False):
        return
    tcfg = getattr(task, "cfg", None)
    if tcfg is None or not hasattr(tcfg, "eval_bleu"):
        raise ConfigError(f"--eval-bleu-start: BLEU is computed by fairseq's --task translation (and its "
                          f"subclasses), not by this task ({type(task).__name__})")
    if not tcfg.eval_bleu:
        raise ConfigError("--eval-bleu-start: needs --eval-bleu (fairseq computes BLEU at validation only with it)")
    if cfg.disable_validation:
        return  # no validation to log it at
    start = BleuStart(cfg, task)

    def first_call(criterion, args):
        start.start(criterion, unwrap_model(args[0]))
        return None

    events.on_first_training_call(first_call)


class BleuStart:
    def __init__(self, cfg, task):
        self.cfg, self.task = cfg, task
        self.subsets = [s for s in str(cfg.valid_subset).split(",") if s]
        self.values: Optional[Dict[str, float]] = None  # subset -> BLEU at θ*
        self.order: List[str] = []  # the subsets whose validation passes call the criterion, in fairseq's order
        self.pass_at = (None, 0)  # (update, passes seen at it)

    def identity(self) -> dict:
        t = self.task.cfg
        return {"pretrained": self.cfg.finetune_from_model or self.cfg.restore_file, "data": str(t.data),
                "subsets": self.subsets, "eval_bleu_args": t.eval_bleu_args, "detok": t.eval_bleu_detok,
                "detok_args": t.eval_bleu_detok_args, "remove_bpe": t.eval_bleu_remove_bpe,
                "tokenized": bool(t.eval_tokenized_bleu)}

    def batches(self, subset: str, model):
        """The subset's batches as fairseq's Trainer.get_valid_iterator makes them, unsharded; the iterator cache
        is bypassed so the Trainer's own (sharded) iterator is not this one."""
        c = self.cfg
        itr = self.task.get_batch_iterator(
            dataset=self.task.dataset(subset), max_tokens=c.max_tokens_valid, max_sentences=c.batch_size_valid,
            max_positions=utils.resolve_max_positions(self.task.max_positions(), model.max_positions()),
            ignore_invalid_inputs=c.skip_invalid_size_inputs_valid_test,
            required_batch_size_multiple=c.required_batch_size_multiple, seed=c.seed, num_shards=1, shard_id=0,
            num_workers=0, epoch=1, disable_iterator_cache=True, skip_remainder_batch=False)
        return itr.next_epoch_itr(shuffle=False, set_dataset_epoch=False)

    def measure(self, criterion, model) -> Dict[str, float]:
        """Each subset's BLEU through fairseq's valid_step and reduce_metrics, at the model's current weights."""
        device = next(model.parameters()).device
        out = {}
        with measuring(model), measuring(criterion):
            for subset in self.order:
                with metrics.aggregate(new_root=True) as agg:  # throwaway: nothing reaches the training logs
                    for sample in self.batches(subset, model):
                        if device.type != "cpu":
                            sample = utils.move_to_cuda(sample, device=device)
                        _, _, log = self.task.valid_step(sample, model, criterion)
                        self.task.reduce_metrics([log], criterion)  # per batch, as the Trainer's valid_step
                    bleu = agg.get_smoothed_values().get("bleu")
                if bleu is not None:
                    out[subset] = float(bleu)
        return out

    def start(self, criterion, model) -> None:
        missing = [s for s in self.subsets if s not in self.task.datasets]
        if missing:
            logger.warning(f"--eval-bleu-start: subsets {missing} not loaded (--combine-valid-subsets?): no "
                           f"bleu_start for them")
        with measuring(model):  # a DataLoader draws its seed from torch's RNG: put it back
            self.order = [s for s in self.subsets if s in self.task.datasets and len(self.batches(s, model)) > 0]
        ident = self.identity()
        path = os.path.join(str(self.cfg.save_dir), STATE_FILE)
        self.values = values_at_theta_star(path, ident, lambda: self.measure(criterion, model),
                                           "--eval-bleu-start: BLEU at θ*", "no bleu_start, no bleu_delta")
        if self.values is None:
            return
        events.on_validation(criterion, BLEU_PASS_MARKER, lambda crit, args: self.log())

    def log(self) -> None:
        """At the start of a subset's validation pass: which subset it is, by its place in fairseq's order."""
        upd, seen = self.pass_at
        now = updates_done()
        if now != upd or seen >= len(self.order):
            seen = 0
        self.pass_at = (now, seen + 1)
        subset = self.order[seen] if seen < len(self.order) else None
        log_bleu_start(self.values.get(subset))

