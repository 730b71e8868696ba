"""The one syntax for sets of encoder layers (``--freeze-encoder-layers``, ``--ca-mtl-*-layers``, FREEZE).

``all``, ``none``, ``lower`` (the lower half: 0-5 of 12), ``upper`` (the upper half), ``top`` (the last
layer), or 0-based indices and ranges such as ``3``, ``0-5`` or ``0-2,7``; case and spaces do not
matter; the empty string is none.
"""

import re
from typing import List, Type

from .errors import ConfigError

NAMED = ("all", "none", "lower", "upper", "top")


def parse_layers(spec: str, num_layers: int, flag: str, error: Type[ConfigError] = ConfigError) -> List[int]:
    """The sorted layer indices ``spec`` names; ``error`` naming ``flag`` for a bad spec or a missing layer."""
    text = str(spec or "").strip().lower()
    named = {"": range(0), "all": range(num_layers), "none": range(0), "lower": range(num_layers // 2),
             "upper": range(num_layers // 2, num_layers), "top": range(num_layers - 1, num_layers)}
    if text in named:
        return list(named[text])
    out = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise error(f"{flag} {spec!r}: expected {', '.join(NAMED)} or layer indices like 0-5 (or 3, or 0-2,7)")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if lo > hi:
            raise error(f"{flag} {spec!r}: range {lo}-{hi} is empty")
        out.update(range(lo, hi + 1))
    bad = sorted(i for i in out if i >= num_layers)
    if bad:
        raise error(f"{flag} {spec!r}: layer {bad[0]} does not exist, the model has {num_layers} encoder "
                          f"layers (0-{num_layers - 1})")
    return sorted(out)
