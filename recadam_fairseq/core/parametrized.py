"""The state-dict names of ``torch.nn.utils.parametrize``'d tensors, shared by LoRA and Mixout.

A parametrized ``<module>.<tensor>`` is saved as ``<module>.parametrizations.<tensor>.original`` plus
the parametrization's own tensors, ``<module>.parametrizations.<tensor>.0.<name>``.
"""

import re
from typing import Dict, Iterable

_KEY = re.compile(r"^(?:(?P<module>.*)\.)?parametrizations\.(?P<tensor>[^.]+)\.(?P<part>original|0\.[^.]+)$")


def groups(state: Iterable[str], parts: Iterable[str]) -> Dict[str, Dict[str, str]]:
    """{plain tensor name: {part: key}} of the keys of ``state`` whose part is one of ``parts``."""
    parts = set(parts)
    out: Dict[str, Dict[str, str]] = {}
    for k in state:
        m = _KEY.match(k)
        if m and m["part"] in parts:
            plain = (m["module"] + "." if m["module"] else "") + m["tensor"]
            out.setdefault(plain, {})[m["part"]] = k
    return out
