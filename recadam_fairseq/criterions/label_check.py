"""At start, every label of every split must fit the classification head (fairseq fails mid-run otherwise).

fairseq's ``sentence_prediction`` turns label tokens into targets ``id - nspecial``: a label the
dictionary has beyond ``--num-classes`` dies with ``IndexError: Target 2 is out of bounds`` at the
first forward that meets it, and a dev label that the training data never had (binarized as
``<unk>``, target -1) at the first validation, after training has run. We read the binarized label
files once (a few bytes per example) and stop before training, naming the file and the label.
"""

import glob
import os

import numpy as np
from fairseq.data.indexed_dataset import MMapIndexedDataset

from ..core.errors import ConfigError


def check_labels(task, flag: str = "--num-classes") -> None:
    """For a ``sentence_prediction``-style task: cfg.data/label/<split>.{idx,bin}, cfg.num_classes
    (``flag``: where the user sets it)."""
    cfg = getattr(task, "cfg", None)
    label_dict = getattr(task, "label_dictionary", None)
    if cfg is None or label_dict is None or getattr(cfg, "regression_target", False):
        return
    num_classes = int(getattr(cfg, "num_classes", 0) or 0)
    data = str(getattr(cfg, "data", "") or "").split(":")[0]
    if num_classes < 1 or not data:
        return
    for idx in sorted(glob.glob(os.path.join(data, "label", "*.idx"))):
        prefix = idx[: -len(".idx")]
        if not os.path.exists(prefix + ".bin"):
            continue
        try:
            index = MMapIndexedDataset.Index(idx)
        except Exception:  # noqa: BLE001 - another --dataset-impl: fairseq reads it, we do not check it
            continue
        tokens = np.memmap(prefix + ".bin", dtype=index.dtype, mode="r")
        bad = _first_bad(tokens, label_dict, num_classes)
        if bad is None:
            continue
        pos, token = bad
        example = int(np.searchsorted(np.cumsum(index.sizes), pos, side="right"))
        where = f"{prefix}.bin, example {example}"
        if token == label_dict.unk():
            raise ConfigError(f"{where}: a label that {os.path.join(data, 'label', 'dict.txt')} does not have "
                              f"(binarized as <unk>): the training data never had it; rebuild the label "
                              f"dictionary from every split, or drop those examples")
        # the class is the label's line in label/dict.txt (by frequency), not its text: say both
        raise ConfigError(f"{where}: label {label_dict[token]!r} (line {token - label_dict.nspecial + 1} of "
                          f"label/dict.txt) is class index {token - label_dict.nspecial}, but "
                          f"{flag} {num_classes} gives the head classes 0-{num_classes - 1}; "
                          f"set {flag} {_classes_needed(tokens, label_dict)}")


def _first_bad(tokens, label_dict, num_classes):
    """(position, token) of the first label token the head cannot take, or None."""
    eos = label_dict.eos()
    ok_hi = label_dict.nspecial + num_classes
    bad = np.flatnonzero((tokens != eos) & ((tokens < label_dict.nspecial) | (tokens >= ok_hi)))
    if len(bad) == 0:
        return None
    return int(bad[0]), int(tokens[bad[0]])


def _classes_needed(tokens, label_dict) -> int:
    labels = tokens[(tokens != label_dict.eos()) & (tokens >= label_dict.nspecial)]
    return int(labels.max()) - label_dict.nspecial + 1
