"""Reading a checkpoint file that may come from anyone: ``torch.load`` in its weights-only mode (a pickled
function is never called), and one line saying why a file was not read.

Every reader of a checkpoint or a Fisher file goes through :func:`load` (the plug-in's θ*, EWC's file, the
forgetting meter, the task scripts, the tools) or :func:`why` (fairseq's own loads, through plumbing/errors_hook.py),
so a file is refused with the same words everywhere: what was refused, why, and to load only files you trust.
"""

import os
import re
import warnings
import zipfile
from typing import Optional

import torch

from .errors import ConfigError

TRUST = "load only files you trust"


class CheckpointFileError(ConfigError):
    """A file that cannot be read as a checkpoint; ``cut_short``: it ends early (a kill during a copy)."""

    def __init__(self, message: str, cut_short: bool = False):
        super().__init__(message)
        self.cut_short = cut_short


def refused(exc: BaseException) -> Optional[str]:
    """Why torch's weights-only loader refused a file (it holds something to import or call), or None when
    ``exc`` is not such a refusal."""
    text = str(exc)
    if "Weights only load failed" not in text:
        return None
    plain = "a checkpoint needs only tensors and plain values"
    m = re.search(r"GLOBAL (\S+?)(?: was not| whose|\s|$)", text)
    if m:
        return f"refused: loading it would import {m.group(1)}, which torch.load's weights-only mode does not do ({plain}); {TRUST}"
    m = re.search(r"unrecognized function (.+?)(?: which belongs| *$)", text, re.M)
    if m:
        return f"refused: loading it would call {m.group(1)}, which torch.load's weights-only mode does not do ({plain}); {TRUST}"
    detail = text.split("WeightsUnpickler error:")[-1] if "WeightsUnpickler error:" in text else ""
    detail = next((ln.strip() for ln in detail.splitlines() if ln.strip()), "a pickled object")
    if detail.startswith("Unsupported operand"):  # a pickle of another protocol (torch.save writes 2), or no pickle
        return (f"refused: a pickle torch.load's weights-only mode does not read ({detail}; torch.save writes "
                f"protocol 2); {TRUST}")
    return f"refused: it holds what torch.load's weights-only mode does not read ({detail}; {plain}); {TRUST}"


def why(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)``'s failure on a file means, in one line (no path)."""
    reason = refused(exc)
    if reason:
        return reason
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    if isinstance(exc, (EOFError, zipfile.BadZipFile)) or "PytorchStreamReader failed" in first:
        return f"cut short or corrupt ({first.split('. ')[0] if first else type(exc).__name__}); {TRUST}"
    return f"not a torch checkpoint ({type(exc).__name__}: {first[:160]}); {TRUST}"


def load(path: str, what: Optional[str] = None, mmap: bool = True):
    """The object ``torch.save`` wrote to ``path``, its tensors memory-mapped where the format allows.

    Raises CheckpointFileError as ``WHAT: why`` (``what`` defaults to the path) when the file is missing, empty,
    cut short, not torch's, or holds anything but tensors and plain values (fairseq's types are allowed by
    ``recadam_fairseq.safe_globals``), unless the user trusts every file (:func:`trusted`)."""
    what = what or path
    if not os.path.isfile(path):
        raise CheckpointFileError(f"{what}: no such file" if not os.path.exists(path) else f"{what}: not a file")
    if os.path.getsize(path) == 0:
        raise CheckpointFileError(f"{what}: an empty file", cut_short=True)
    start = _start(path)
    if start == ZIP and not zipfile.is_zipfile(path):  # torch.save's zip: its directory is written last
        raise CheckpointFileError(f"{what}: cut short (no zip directory at its end)", cut_short=True)
    if start != ZIP and start[:1] != PICKLE:  # text, an archive of another kind: torch's error would be a KeyError
        raise CheckpointFileError(f"{what}: not a torch checkpoint (neither torch.save's zip nor a pickle); {TRUST}")
    safe = not trusted()
    try:
        with warnings.catch_warnings():  # torch's two lines on a pickle of protocol > 2: refused below in one
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            try:
                return torch.load(path, map_location="cpu", mmap=mmap, weights_only=safe)
            except RuntimeError as e:  # a legacy (non-zip) file cannot be memory-mapped: read it whole
                if not mmap or "mmap can only be used" not in str(e):
                    raise
                return torch.load(path, map_location="cpu", weights_only=safe)
    except Exception as e:  # noqa: BLE001 - every failure here is the file's
        cut = isinstance(e, (EOFError, zipfile.BadZipFile)) or "PytorchStreamReader failed" in str(e)
        raise CheckpointFileError(f"{what}: {why(e)}", cut_short=cut) from None


def trusted() -> bool:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: the user trusts every file this process reads, as torch and fairseq's
    own loads then do (their pickled code runs)."""
    return os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true")


ZIP, PICKLE = b"PK\x03\x04", b"\x80"  # torch.save's zip; a pickle of protocol 2 or above (legacy torch.save)


def _start(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def fairseq_state(path: str, what: Optional[str] = None) -> dict:
    """:func:`load` of a fairseq checkpoint: a dict whose ``model`` is a state dict of tensors."""
    state = load(path, what)
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, dict) or not model or not all(torch.is_tensor(v) for v in model.values()):
        raise CheckpointFileError(f"{what or path}: not a fairseq checkpoint (it has no 'model' state dict of "
                                  f"tensors)")
    return state
