"""Let ``torch.load`` (weights_only, the default since torch 2.6) read what fairseq pickles.

fairseq calls ``torch.load`` without ``weights_only``; torch >= 2.6 then refuses the Python
objects fairseq puts in its checkpoints, and in the state it broadcasts from rank 0 to the other
ranks when loading a checkpoint in distributed training. We allow-list exactly those types
instead of switching the check off. Tools run without ``--user-dir`` can do the same with
``import recadam_fairseq.safe_globals``.
"""

import argparse
import collections
import importlib
import typing
import warnings

import numpy as np

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

# In checkpoint files (fairseq 0.12.x): the legacy ``args`` namespace (also inside cfg.model),
# numpy scalars where a criterion logs a numpy metric (fairseq's sentence_prediction: pearson)
# that best-checkpoint tracking stores, and numpy arrays in the saved meters (the translation
# task's --eval-bleu logs its n-gram counts as int64 arrays).
CHECKPOINT_GLOBALS = [argparse.Namespace, np.dtype, np.ndarray,
                      *{type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32)}]
for _module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2 / numpy 1 pickles
    for _name in ("scalar", "_reconstruct"):
        try:
            with warnings.catch_warnings():  # numpy 2 deprecates the numpy.core alias
                warnings.simplefilter("ignore", DeprecationWarning)
                CHECKPOINT_GLOBALS.append((getattr(importlib.import_module(_module), _name), f"{_module}.{_name}"))
        except (ImportError, AttributeError):
            pass

# In the checkpoint state rank 0 broadcasts (checkpoint_utils.load_checkpoint_to_cpu has turned
# its ``cfg`` into an omegaconf DictConfig): the containers, their nodes and metadata.
BROADCAST_GLOBALS = [
    DictConfig, ListConfig, ContainerMetadata, Metadata,
    AnyNode, StringNode, IntegerNode, FloatNode, BooleanNode,
    typing.Any, collections.defaultdict, dict, list, int,
]

try:  # broadcast_object() sends tensors apart and pickles a placeholder for each
    from fairseq.distributed.utils import _TensorPlaceholder

    BROADCAST_GLOBALS.append(_TensorPlaceholder)
except ImportError:  # an older fairseq without it pickles the tensors themselves
    pass

torch.serialization.add_safe_globals(CHECKPOINT_GLOBALS + BROADCAST_GLOBALS)
