"""recadam-fairseq: RecAdam for fairseq (a --user-dir extension).

Importing this package registers the ``recadam`` optimizer and the recadam criteria with fairseq
(when fairseq is installed) and allow-lists fairseq's checkpoint types for ``torch.load``.
"""

from .anneal import anneal_lambda  # noqa: F401
from .recadam import RecAdam  # noqa: F401

try:
    import fairseq  # noqa: F401
except ImportError:  # the core works without fairseq
    pass
else:
    from . import safe_globals  # noqa: F401
    from .criterions import sentence_prediction_recadam  # noqa: F401
    from .optim import fairseq_recadam  # noqa: F401

__all__ = ["RecAdam", "anneal_lambda"]
