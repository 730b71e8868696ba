"""recadam-fairseq: RecAdam and the methods it is compared with, as a fairseq ``--user-dir``.

``import recadam_fairseq`` imports neither fairseq nor torch; ``recadam_fairseq.RecAdam`` and
``recadam_fairseq.anneal_lambda`` (the pure-torch API) load on first use. The fairseq components
(optimizers, criteria, tasks, models), the ``torch.load`` allow-list for fairseq's checkpoints and
the one-line report of the plug-in's own errors register when fairseq is already imported, as it
is under ``--user-dir`` (fairseq-train, fairseq-hydra-train, ``from_pretrained(..., user_dir=...)``),
or on an explicit ``recadam_fairseq.register()``. Call that when this package was imported before
fairseq in the same process: fairseq's ``--user-dir`` then finds it imported and skips it.
"""

import importlib
import sys
import warnings

# a command-line tool imports the package before fairseq: fairscale's FutureWarnings (its offload module uses
# torch.cuda.amp's deprecated decorators on import, when fairseq imports it) kept off the user's terminal
warnings.filterwarnings("ignore", category=FutureWarning, module=r"fairscale(\.|$)")

_API = {"RecAdam": ".core.recadam", "anneal_lambda": ".core.anneal"}


def __getattr__(name):  # PEP 562: the API loads torch only when used
    if name in _API:
        return getattr(importlib.import_module(_API[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register every fairseq component of this package (idempotent)."""
    from . import plugin  # noqa: F401  (importing it registers each component once)


if sys.modules.get("fairseq") is not None:  # loaded by fairseq (--user-dir), or after it
    register()

__all__ = ["RecAdam", "anneal_lambda", "register"]
