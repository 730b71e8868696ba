"""The forgetting meter's names in the logs, for their readers (scripts/glue/summarize.py, the task scripts'
progress lines): pure Python, no torch.

Forgetting = sign × the logged change since θ*, positive when the model lost something: the masked-LM loss
went up (``fgt_mlm_loss_delta``, bits per masked token), or the pair AUC went down (``fgt_pairs_auc_delta``).
"""

from typing import Optional, Tuple

# logged change -> (what it is, sign making "forgot" positive)
DELTAS = {"fgt_mlm_loss_delta": ("mlm loss (bits)", 1.0), "fgt_pairs_auc_delta": ("pair AUC", -1.0)}


def forgetting(record: dict, prefix: str = "") -> Optional[Tuple[str, float]]:
    """(the delta's key, forgetting) of one validation record (keys ``prefix + name``), or None without a meter."""
    for key, (_, sign) in DELTAS.items():
        if prefix + key in record:
            try:
                return key, sign * float(record[prefix + key])
            except (TypeError, ValueError):
                return None
    return None
