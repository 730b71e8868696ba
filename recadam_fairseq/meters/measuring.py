"""How a meter measures the model during a run (the forgetting meter, ``--eval-bleu-start``): without changing
training (:func:`measuring`), once at θ* before update 1 and kept in ``SAVE_DIR`` for a resumed run
(:func:`values_at_theta_star`), at the update fairseq's validation runs at (:func:`updates_done`)."""

import json
import logging
import os
from contextlib import contextmanager
from typing import Optional

import torch
from fairseq.logging import metrics

from ..plumbing import events

logger = logging.getLogger(__name__)


@contextmanager
def measuring(model: torch.nn.Module):
    """Eval mode, no gradients; afterwards every module's mode and the RNG states as they were."""
    modes = [(m, m.training) for m in model.modules()]
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, mode in modes:
            m.training = mode
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def updates_done() -> Optional[int]:
    """fairseq's update count during a validation, whose fresh root aggregator hides it from
    events.update_number(): its "default" aggregator, which the Trainer logs num_updates into."""
    meter = metrics.get_meter("default", "num_updates")
    return None if meter is None or meter.val is None else int(meter.val)


def values_at_theta_star(path: str, ident: dict, measure, what: str, without: str):
    """The values ``what`` names, at θ*: from ``path`` when it was written for this run (``ident``: what they
    depend on; a resume), else measured now, before update 1, and written there; None (a warning) for a run
    resumed without the file."""
    saved = read_state(path)
    if saved is not None and saved.get("identity") == ident:
        logger.info(f"{what} from {path}: {saved['start']}")
        return saved["start"]
    if events.update_number() == 0:
        values = measure()
        write_state(path, {"identity": ident, "start": values})
        logger.info(f"{what} (before update 1): {values}")
        return values
    logger.warning(f"{what.split(':')[0]}: resumed at update {events.update_number()} without {path}: {without}")
    return None


def read_state(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_state(path: str, state: dict) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
        return  # rank 0 writes it
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
    os.replace(path + ".tmp", path)
