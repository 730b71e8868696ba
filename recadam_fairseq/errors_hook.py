"""The plug-in's own errors as one line: ``fairseq-train: error: --rho must be >= 0 ...``, no traceback.

Installed when fairseq loads the user-dir (``plugin.py``): a ``sys.excepthook`` that prints a
:class:`~recadam_fairseq.core.errors.ConfigError` as one line on stderr, and hands every other exception to the hook that was there before, with its
traceback. The exit status stays 1. ``RECADAM_TRACEBACK=1`` shows the traceback of ours too.
"""

import os
import sys
from typing import Optional

from .core.errors import ConfigError


def ours(exc: Optional[BaseException]) -> Optional[ConfigError]:
    """``exc`` if it is the plug-in's own ConfigError (another exception raised from one keeps its traceback)."""
    return exc if isinstance(exc, ConfigError) else None


def one_line(err: BaseException) -> str:
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog}: error: " + " ".join(str(err).split())


def install() -> None:
    """Chain a hook in front of the current ``sys.excepthook`` (once per process)."""
    previous = sys.excepthook
    if getattr(previous, "recadam_fairseq", False):
        return

    def hook(etype, value, tb):
        err = ours(value)
        if err is None or os.environ.get("RECADAM_TRACEBACK"):
            return previous(etype, value, tb)
        sys.stderr.write(one_line(err) + "\n")
        sys.stderr.flush()

    hook.recadam_fairseq = True
    sys.excepthook = hook
