"""The benchmarks' and the GPU pass's rows of each method (the catalogue's names): scripts/bench_methods.py's sets
(``sam``, ``baselines``, ``regularisers``) and scripts/gpu/e2e_overhead.py's (``gpu``). A method without a row here
is timed by neither; its flags are the catalogue's."""

from dataclasses import dataclass, replace
from typing import Dict, List, Tuple


@dataclass(frozen=True)
class Variant:
    """One row a method gives a benchmark: a set of scripts/bench_methods.py or the GPU pass (``gpu``)."""

    where: str
    label: str = ""  # the row's name (default: the method's)
    values: Tuple[Tuple[str, str], ...] = ()  # knob values other than the benchmark's own
    extra: Tuple[str, ...] = ()  # flags after the method's
    base: str = ""  # the row it is timed against (default: its base method's row; its own label: none)
    default: bool = True  # the GPU pass times it when --methods does not say


GPU = Variant("gpu")  # the GPU pass at its own settings


def _sam_types(label: str, types: Tuple[str, ...]) -> Tuple[Variant, ...]:
    """The SAM benchmark's rows of a method and of its --sam-type variants (the last --sam-type counts)."""
    return (Variant("sam", label),) + tuple(Variant("sam", t, extra=("--sam-type", t)) for t in types)


ROWS: Dict[str, Tuple[Variant, ...]] = {
    "adam": (GPU,),
    "recadam": (GPU, Variant("gpu", "recadam-bf16-anchor", extra=("--recadam-anchor-dtype", "bf16")),
                # a per-tensor layout's program as a CUDA graph (--precision fp32: the layout it is for)
                Variant("gpu", "recadam-cudagraph", extra=("--recadam-fused", "cuda-graph"), base="recadam",
                        default=False)),
    "recadam-coupled": (Variant("gpu", values=(("gamma", "5"),), base="adam"),),
    # EWC's F from the task: 1,024 per-example gradients before update 1, outside the GPU pass's timed intervals
    "ewc": (Variant("gpu", values=(("gamma", "5"),)),),
    "recadam-ewc": (Variant("gpu", values=(("gamma", "500"),)),),
    "r3f": (GPU,),
    "r4f": (Variant("gpu", default=False),),
    "recadam-r3f": (Variant("gpu", default=False),),
    "sam": (GPU,) + _sam_types("sam", ("esam", "gsam")),
    "fsam": (GPU,) + _sam_types("fisher-sam", ("fisher-esam", "fisher-gsam")),
    "recadam-fsam": (GPU, Variant("sam", "recadam+fisher-sam")),
    # plain RoBERTa through --task glue_multitask: CA-MTL's base
    "freeze": (Variant("gpu", "mt-roberta", values=(("layers", "0"),), base="mt-roberta"),),
    "ca-mtl": (GPU,),
    "llrd": (GPU, Variant("baselines", "llrd 0.9")),
    "recadam-llrd": (GPU, Variant("baselines", "recadam+llrd 0.9")),
    "reinit": (GPU, Variant("baselines", "reinit 1", (("reinit", "1"),))),
    "recadam-reinit": (Variant("baselines", "recadam+reinit 1", (("reinit", "1"),)),),
    "lora": (GPU, Variant("baselines", "lora r=8 (q, v)"),
             Variant("baselines", "lora r=8 (all six)", extra=("--lora-modules", "q,k,v,out,fc1,fc2"))),
    "mixout": (GPU, Variant("regularisers", "mixout 0.9")),
    "recadam-mixout": (GPU, Variant("regularisers", "recadam+mixout 0.9")),
    "childtune-d": (GPU, Variant("regularisers", "childtune-d 0.3")),
    "childtune-f": (Variant("regularisers", "childtune-f 0.3"),),
    "recadam-childtune-d": (GPU, Variant("regularisers", "recadam+childtune-d 0.3")),
    "rdrop": (GPU, Variant("regularisers", "rdrop 1", (("alpha", "1"),))),
    "recadam-rdrop": (GPU, Variant("regularisers", "recadam+rdrop 1", (("alpha", "1"),))),
}


def variants(method: str, where: str) -> List[Variant]:
    """``method``'s rows of set ``where``, each with its label."""
    return [replace(v, label=v.label or method) for v in ROWS.get(method, ()) if v.where == where]
