"""recadam-fairseq: RecAdam and the methods it is compared with, as a fairseq ``--user-dir``.

``import recadam_fairseq`` gives the pure-torch API (``RecAdam``, ``anneal_lambda``) and imports
no fairseq. The fairseq components (optimizers, criteria, tasks, models) and the ``torch.load``
allow-list for fairseq's checkpoints register when fairseq is already imported, as it is under
``--user-dir`` (fairseq-train, fairseq-hydra-train, ``from_pretrained(..., user_dir=...)``), or
on an explicit ``recadam_fairseq.register()``. Call that when this package was imported before
fairseq in the same process: fairseq's ``--user-dir`` then finds it imported and skips it.
"""

import sys

from .anneal import anneal_lambda  # noqa: F401
from .recadam import RecAdam  # noqa: F401


def register() -> None:
    """Register every fairseq component of this package (idempotent)."""
    from . import plugin  # noqa: F401  (importing it registers each component once)


if "fairseq" in sys.modules:  # loaded by fairseq (--user-dir), or after it
    register()

__all__ = ["RecAdam", "anneal_lambda", "register"]
