"""``--task translation``'s BLEU settings, checked when the plug-in's seq2seq criteria are built (before training).

fairseq takes each of these and fails or misleads later: ``--best-checkpoint-metric bleu`` without
``--eval-bleu`` stops at the first validation (KeyError 'bleu', after training has run) and without
``--maximize-best-checkpoint-metric`` keeps the lowest BLEU as checkpoint_best.pt; an
``--eval-bleu-remove-bpe`` fairseq does not know raises at the first validation; and BLEU on BPE'd
or Moses-escaped text that the flags do not undo is a number, but not of words (``core/subwords.py``
reads the target dictionary). fairseq's own start-up failures of ``--eval-bleu`` (an unknown or
uninstalled ``--eval-bleu-detok``, JSON that does not parse) are turned into one line by ``plumbing/errors_hook.py``.
"""

import os

from ..core import subwords
from ..core.errors import ConfigError


def _resolved(value):
    """None for a value never resolved (a bare dataclass built by hand: an ``${...}`` interpolation)."""
    return None if value is None or (isinstance(value, str) and value.startswith("${")) else value


def check_bleu(task, best_checkpoint_metric=None, maximize_best_checkpoint_metric=None) -> None:
    cfg = getattr(task, "cfg", None)
    if cfg is None or not hasattr(cfg, "eval_bleu"):  # not fairseq's translation config
        return
    metric, maximize = _resolved(best_checkpoint_metric), _resolved(maximize_best_checkpoint_metric)
    if metric == "bleu" and not cfg.eval_bleu:
        raise ConfigError("--best-checkpoint-metric bleu: fairseq computes BLEU only with --eval-bleu (without it "
                          "the first validation stops on KeyError 'bleu', after training has run); add --eval-bleu")
    if not cfg.eval_bleu:
        return
    if metric == "bleu" and maximize is False:
        raise ConfigError("--best-checkpoint-metric bleu: checkpoint_best.pt would keep the lowest BLEU; add "
                          "--maximize-best-checkpoint-metric")
    remove = cfg.eval_bleu_remove_bpe
    if remove is not None and remove not in subwords.REMOVE_BPE:
        raise ConfigError(f"--eval-bleu-remove-bpe {remove!r}: fairseq knows {', '.join(map(repr, subwords.REMOVE_BPE))} "
                          f"(another value stops the first validation, after training has run)")
    d = task.target_dictionary
    data = str(cfg.data).split(os.pathsep)[0]
    where = f"the target dictionary ({os.path.join(data, f'dict.{cfg.target_lang}.txt')})"
    symbols = d.symbols[d.nspecial:]
    mark = subwords.marking(symbols)
    if mark is not None and remove not in mark.undo:
        given = "no --eval-bleu-remove-bpe" if remove is None else f"--eval-bleu-remove-bpe {remove!r}"
        raise ConfigError(f"--eval-bleu: {where} is {mark.scheme} ({mark.marked:,} of {mark.total:,} symbols "
                          f"marked) and {given} undoes it, so BLEU would count subword pieces; add "
                          f"--eval-bleu-remove-bpe {mark.undo[0]}")
    escape = subwords.moses_escaped(symbols)
    if escape is not None and cfg.eval_bleu_detok != "moses" and not cfg.eval_tokenized_bleu:
        raise ConfigError(f"--eval-bleu-detok {cfg.eval_bleu_detok}: {where} holds Moses's escape {escape!r}, so "
                          f"the text is Moses-tokenized and sacrebleu would score it undetokenized; add "
                          f"--eval-bleu-detok moses (or --eval-tokenized-bleu to score the tokens as they are)")
