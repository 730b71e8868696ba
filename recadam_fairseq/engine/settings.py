"""A setting's vocabulary, from the catalogue: which knobs name a method's settings (the comparison's spec, a
grid's rows, the figures' labels), how a knob's value is written, and the curve a setting belongs to."""

from typing import Dict, Tuple

from recadam_fairseq import catalogue

# knobs that never tell two settings apart: pinned by the comparison, left at the catalogue's in a grid's rows
SPEC_EXCLUDED = ("anneal_fun", "eps", "keep_ratio", "mask_iter_e", "lora_alpha", "fisher")
METHODS: Dict[str, Tuple[str, ...]] = {  # name -> its knobs, in positional order
    n: tuple(k for k in m.knobs if k not in SPEC_EXCLUDED)
    for n, m in catalogue.METHODS.items()}
KNOB_NAMES = tuple(k for k in catalogue.KNOBS if k not in SPEC_EXCLUDED)


def fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def group(s: dict) -> str:
    """The curve a setting belongs to (frontiers, plot): its method; RecAdam's γ = 0 control apart."""
    return s["method"] + " γ=0 (λ(t) only)" if s.get("gamma") == 0 else s["method"]
