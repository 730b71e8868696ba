"""The forgetting meter's names in the logs, for their readers (scripts/glue/summarize.py, the task scripts'
progress lines): pure Python, no torch.

Forgetting = sign × the logged change since θ*, positive when the model lost something: the masked-LM loss
went up (``fgt_mlm_loss_delta``, bits per masked token), or the pair AUC went down (``fgt_pairs_auc_delta``).
On translation (``--eval-bleu-start``): BLEU went down on the original domain's subset, the valid subsets after
the first (``<subset>_bleu_delta``; the first subset is the new domain, where BLEU is to go up).
"""

from typing import Dict, Optional, Tuple

# logged change -> (what it is, sign making "forgot" positive)
DELTAS = {"fgt_mlm_loss_delta": ("mlm loss (bits)", 1.0), "fgt_pairs_auc_delta": ("pair AUC", -1.0)}
BLEU_DELTA = "bleu_delta"  # --eval-bleu-start's bleu − bleu_start of one subset (meters/bleu_start.py)
ROUND = 5  # the meter's values and changes, as logged (and so as read back)
BUDGET = "fgt_budget"  # --forgetting-budget, logged at each validation
BUDGET_PREFIX = BUDGET + "_"  # fgt_budget_<metric>: <metric> where the validation forgot at most the budget


def changes(values: Dict[str, float], start: Optional[Dict[str, float]]) -> Dict[str, float]:
    """The meter's ``fgt_<name>_delta`` (now − at θ*) of its measured ``values``, rounded as logged."""
    return {f"fgt_{k}_delta": round(v - start[k], ROUND) for k, v in values.items() if start and k in start}


def within_budget(forgot: Optional[float], budget: float) -> bool:
    """A validation that forgot ``forgot`` (None: not known) is within ``budget``: the meter's and summarize.py's rule."""
    return forgot is not None and forgot <= budget


def _float(x) -> Optional[float]:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def forgetting(record: dict, prefix: str = "", others: Optional[Dict[str, dict]] = None
               ) -> Optional[Tuple[str, float]]:
    """(the delta's key, forgetting) of one validation record (keys ``prefix + name``), or None without a meter.
    ``others``: the other valid subsets' records of the same validation ({subset: record}, keys without the
    subset's prefix); without the meter, the largest BLEU fall among them, keyed ``<subset>_bleu_delta``."""
    for key, (_, sign) in DELTAS.items():
        if prefix + key in record:
            value = _float(record[prefix + key])
            return None if value is None else (key, sign * value)
    falls = [(f"{subset}_{BLEU_DELTA}", 0.0 - _float(rec[BLEU_DELTA])) for subset, rec in (others or {}).items()
             if _float(rec.get(BLEU_DELTA)) is not None]
    return max(falls, key=lambda f: f[1]) if falls else None


def moved(key: str, forgot: float) -> str:
    """Which way the measure of ``key`` went, for a line a person reads: "pair AUC fell by 0.0266", "mlm loss rose by
    0.0012 bits", "BLEU on test fell by 1.3" (``forgot``: :func:`forgetting`'s value, positive = forgot)."""
    if key in DELTAS:
        name, sign = DELTAS[key]
        name, unit = (name[:-len(" (bits)")], " bits") if name.endswith(" (bits)") else (name, "")
    else:
        name, sign, unit = label(key), -1.0, ""
    change = sign * forgot  # the measure's own change: now − at θ*
    if change == 0:
        return f"{name} unchanged"
    return f"{name} {'rose' if change > 0 else 'fell'} by {abs(change):.4g}{unit}"


def label(key: str) -> str:
    """What a key :func:`forgetting` returns measures, for the scripts' lines and tables."""
    if key in DELTAS:
        return DELTAS[key][0]
    return f"BLEU on {key[:-len(BLEU_DELTA) - 1]}" if key.endswith("_" + BLEU_DELTA) else key
