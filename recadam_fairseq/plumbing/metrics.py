"""The metrics every recadam run reports through fairseq's logging (train_inner, json, tensorboard, wandb)."""

import math

from fairseq.logging import metrics

from ..core import forgetting
from ..core.errors import ConfigError

RECADAM_METRICS = ("recadam_lambda", "recadam_dist", "recadam_penalty")


def log_recadam_metrics(recadam_lambda: float, recadam_dist: float, recadam_penalty: float) -> None:
    """λ(t), Σ(θ−θ*)² over the anchored parameters, and γ/2 of it (the simulated source loss).

    weight=0 makes the logged value the latest one, not an average over the log interval. A value may be a tensor
    (the coupled term's: no host sync in the step); round=12 makes fairseq read it as a float when it logs, as every
    backend (json, tensorboard, wandb) takes it.
    """
    for priority, (key, value) in enumerate(zip(RECADAM_METRICS, (recadam_lambda, recadam_dist, recadam_penalty))):
        metrics.log_scalar(key, value, weight=0, priority=300 + priority, round=12)


def log_target_loss(logging_outputs) -> None:
    """``target_loss``: the task loss without the terms a criterion adds (R3F, R-Drop, the coupled pull), in bits
    per sample-size unit as fairseq logs ``loss``."""
    sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
    target = sum(log.get("target_loss", 0) for log in logging_outputs)
    metrics.log_scalar("target_loss", target / max(sample_size, 1) / math.log(2), sample_size, round=3)  # read at log time


SAM_METRICS = ("sam_rho", "sam_eps_norm", "sam_mask_frac", "sam_sharpness")


def log_sam_metrics(rho: float, eps_norm: float, mask_frac: float, sharpness: float) -> None:
    """ρ_t, ‖ε‖ (mean over micro-batches), the fraction of parameter elements ε touches, and the sharpness
    L(θ+ε) − L(θ) per example (nats), averaged over the log interval like the loss."""
    for priority, (key, value) in enumerate(zip(SAM_METRICS, (rho, eps_norm, mask_frac, sharpness))):
        metrics.log_scalar(key, value, priority=320 + priority, round=6)


def log_forgetting_metrics(values: dict, start: dict = None) -> None:
    """The forgetting meter's probe values as ``fgt_<name>`` and, with θ*'s values, ``fgt_<name>_delta`` (now −
    at θ*), logged once per validation pass into its aggregator (meters/forgetting_meter.py)."""
    for priority, (name, value) in enumerate(values.items()):
        metrics.log_scalar(f"fgt_{name}", value, priority=340 + 2 * priority, round=forgetting.ROUND)
        if start is not None and name in start:
            metrics.log_scalar(f"fgt_{name}_delta", value - start[name], priority=341 + 2 * priority,
                               round=forgetting.ROUND)


def log_forgetting_budget(budget: float, metric: str, within: bool, maximize: bool) -> None:
    """``fgt_budget`` (the budget) and ``fgt_budget_<metric>``: ``metric``'s value when this validation forgot at most
    the budget, else the worst value (−inf maximized, +inf minimized), so that fairseq's ``--best-checkpoint-metric
    fgt_budget_<metric>`` keeps the best validation within it as checkpoint_best.pt. Derived when the pass's
    logs are written, after the task metrics (fairseq's own rounding: the logged metric's value exactly)."""
    worst = -math.inf if maximize else math.inf

    def value(meters):
        if metric not in meters:
            raise ConfigError(f"--best-checkpoint-metric {forgetting.BUDGET_PREFIX}{metric}: this run logs no {metric} "
                              f"at validation (it logs {', '.join(k for k in meters if not k.startswith('_'))})")
        return meters.get_smoothed_value(metric) if within else worst

    metrics.log_scalar(forgetting.BUDGET, budget, priority=348)
    metrics.log_derived(forgetting.BUDGET_PREFIX + metric, value, priority=349)


BLEU_PASS_MARKER = "_bleu_start_pass"  # hidden ("_"): marks a validation pass as seen (events.on_validation)


def log_bleu_start(start: float = None) -> None:
    """``bleu_start``, a subset's BLEU at θ* (meters/bleu_start.py), and ``bleu_delta`` = fairseq's ``bleu`` − it, derived
    when the pass's logs are written (fairseq derives ``bleu`` so too), both to fairseq's 2 decimals; logged once
    per validation pass into its aggregator."""
    metrics.log_scalar(BLEU_PASS_MARKER, 1)
    if start is None:
        return
    metrics.log_scalar("bleu_start", start, priority=350, round=2)
    metrics.log_derived("bleu_delta", lambda meters: bleu_delta(meters, start), priority=351)


def bleu_delta(meters, start: float):
    """None where fairseq logged no ``bleu`` (a pass without n-grams): the logs then carry no number."""
    if "bleu" not in meters:
        return None
    return round(float(meters.get_smoothed_value("bleu")) - start, 2)
