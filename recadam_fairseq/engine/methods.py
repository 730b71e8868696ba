"""The methods the comparison runs: a ``--methods`` spec -> the fairseq-train flags that turn it on.

A spec is ``NAME`` or ``NAME:VALUES``; VALUES are the method's knobs, either positional in the
order below or ``KEY=VALUE`` pairs separated by commas (unset knobs take the defaults below)::

    adam
    recadam:0.1:40            k, t0 (γ = --gamma)        recadam:0.1:40:0   γ = 0: λ(t) alone, no pull
    recadam-coupled:0.1:40    the coupled objective λ(t)·L + (1−λ(t))·γ/2·‖θ−θ*‖² (criterion), fairseq's adam
    recadam-random-init:0.1:40   no --restore-file: random weights, the pull recalls θ* (the paper's choice)
    r3f:1   r4f:1             λ of the consistency term (R4F: + spectral norm on the head)
    sam:0.05   fsam:0.05      ρ (fsam: SAM with FSAM's Fisher mask, keep ratio 0.1)
    recadam-r3f:k=0.1,t0=40,lambda=1      recadam-fsam:k=0.1,t0=40,rho=0.05
    freeze:3                  the embeddings and encoder layers 0..N-1 frozen (glue_multitask's freezing)
    ca-mtl:0   ca-mtl:3       CA-MTL's task-conditioned encoder (ca_mtl_roberta) on the target task,
                              encoder layers 0..N-1 frozen (the paper freezes the lower half)
    recadam-ca-mtl:k=0.1,t0=25,freeze=3   RecAdam with it (CA-MTL's new modules are not pulled)
    llrd:0.9                  layer-wise lr decay γ (--layer-lr-decay) with plain Adam (recadam, w = 0)
    recadam-llrd:k=0.1,t0=50,decay=0.9    RecAdam with layer-wise lr decay
    reinit:2                  the top N encoder layers re-initialised (roberta_ft, --reinit-layers), Adam
    recadam-reinit:k=0.1,t0=50,reinit=2   RecAdam with them (the re-initialised layers are not pulled)
    lora:8                    LoRA of rank r on attention q and v (roberta_ft, α = 8), the encoder frozen,
                              at LoRA's own lr (the catalogue's) instead of --lr
    mixout:0.9                Mixout toward θ* with probability p on the encoder's linear layers (roberta_ft)
    recadam-mixout:k=0.1,t0=50,p=0.9      RecAdam with it (Mixout's targets are RecAdam's θ*)
    childtune-d:0.3   childtune-f:0.3     ChildTuning-D (Fisher mask) / -F (random mask) keeping a fraction
                              p of the gradient, plain Adam (recadam, w = 0)
    recadam-childtune-d:k=0.1,t0=50,ratio=0.3   RecAdam with ChildTuning-D
    rdrop:1                   R-Drop's α (sentence_prediction_rdrop)
    recadam-rdrop:k=0.1,t0=50,alpha=1     RecAdam with R-Drop

Every method is a flag set on one shared command (same data, lr schedule, batch, updates, seed), the
catalogue's (recadam_fairseq/catalogue.py: its flags, knobs and models); nothing here runs anything. The
comparison's own choices: which knobs a spec varies (the rest at the catalogue's defaults or pinned
below), t0 and R3F's λ defaults for its 200-update runs. A spec's name is the catalogue's (its old spelling
``recadam+X`` is taken too, and recorded under the catalogue's).
In the multi-task setting (``flags(..., multitask=True)``) every run trains on all the target tasks at
once through ``--task glue_multitask`` (uniform task sampling), and only the methods of
MULTITASK_METHODS are allowed.
"""

from typing import Dict, List, Optional, Tuple

from recadam_fairseq import catalogue
from recadam_fairseq.engine.settings import METHODS, SPEC_EXCLUDED, fmt

# knobs a spec does not vary: their flags at these values (those left out add no flag)
# (EWC's F: the task's, which ewc_fisher.py swaps for the task's one shared file)
PINNED = {"anneal_fun": "sigmoid", "eps": "1e-05", "lora_alpha": "8", "fisher": "task"}
DEFAULTS = {"t0": 40.0, "lambda": 1.0}  # the comparison's own, for its 200-update runs
INT_KNOBS = tuple(k for k, knob in catalogue.KNOBS.items() if knob.type is int and k not in SPEC_EXCLUDED)
# knob: its default in a spec (gamma: --gamma)
KNOBS = {k: None if k == "gamma" else DEFAULTS.get(k, (int if k in INT_KNOBS else float)(knob.default))
         for k, knob in catalogue.KNOBS.items() if k not in SPEC_EXCLUDED}
RECADAM = ("k", "t0", "gamma")
# the target task's slot for --task glue_multitask (freeze, ca-mtl): binary sentiment, SST-2's format
MT_TASK = "SST-2"
# what the multi-task setting compares: plain RoBERTa and CA-MTL, each with and without RecAdam
MULTITASK_METHODS = tuple(n for n, m in catalogue.METHODS.items() if m.multitask)


class MethodError(ValueError):
    """A bad --methods spec; the message names it."""


def parse(spec: str, gamma: float = 5000.0) -> dict:
    """``NAME[:VALUES]`` -> {"method": NAME, knob: value, ...}; errors name the spec."""
    name, _, rest = spec.strip().partition(":")
    name = catalogue.ALIASES.get(name, name)
    if name not in METHODS:
        raise MethodError(f"--methods {spec!r}: unknown method {name!r}; known: {', '.join(METHODS)}")
    knobs = METHODS[name]
    given = {}
    if rest:
        if "=" in rest:
            for part in rest.split(","):
                key, eq, value = part.partition("=")
                if not eq or key.strip() not in knobs:
                    raise MethodError(f"--methods {spec!r}: {part!r} is not KEY=VALUE with KEY one of "
                                      f"{', '.join(knobs) or '(none: ' + name + ' has no knobs)'}")
                given[key.strip()] = value.strip()
        else:
            values = rest.split(":")
            if len(values) > len(knobs):
                raise MethodError(f"--methods {spec!r}: {name} takes at most {len(knobs)} value(s) "
                                  f"({':'.join(k.upper() for k in knobs) or 'none'})")
            given = dict(zip(knobs, values))
    out = {"method": name}
    for key in knobs:
        default = KNOBS[key] if key != "gamma" else gamma
        try:
            value = (int if key in INT_KNOBS else float)(given[key]) if key in given else default
        except ValueError:
            raise MethodError(f"--methods {spec!r}: {key} = {given[key]!r} is not a number") from None
        if value < 0:
            raise MethodError(f"--methods {spec!r}: {key} must be >= 0, got {given[key]}")
        out[key] = value
    return out


def task_fisher_at(args: List[str]) -> Optional[int]:
    """The index of ``task`` in ``--ewc-fisher task`` among ``args`` (EWC's F computed by the run), else None."""
    i = args.index("--ewc-fisher") + 1 if "--ewc-fisher" in args else None
    return i if i is not None and args[i] == "task" else None


def setting_name(s: dict) -> str:
    """A run's directory name in the catalogue's grammar (Method.run_name, read back by catalogue.parse_run_name as
    a user's grid's): the method and every knob the spec varies (``recadam-k0.1-t40-g5000``, ``sam-rho0.05``)."""
    return method_of(s).run_name({k: fmt(s[k]) for k in METHODS[s["method"]]}, explicit=True)


def label(s: dict) -> str:
    """A setting in words, for tables and legends."""
    parts = []
    for k in METHODS[s["method"]]:
        parts.append(f"{catalogue.KNOBS[k].label or k}={fmt(s[k])}")
    text = s["method"] + (" " + " ".join(parts) if parts else "")
    return text + " (λ(t) only, no pull)" if s.get("gamma") == 0 else text


def knob_text(s: dict) -> str:
    return ", ".join(f"{k}={fmt(s[k])}" for k in METHODS[s["method"]])


def method_of(s: dict) -> catalogue.Method:
    return catalogue.get(s["method"])


def uses_multitask(s: dict) -> bool:
    return method_of(s).task == "glue_multitask"


def check(s: dict, num_layers: int) -> None:
    """The knob values a run cannot take (the catalogue's bounds), as a MethodError naming the setting."""
    for key in METHODS[s["method"]]:
        why = catalogue.KNOBS[key].out_of_bounds(s[key], num_layers)
        if why:
            raise MethodError(f"--methods {setting_name(s)}: {why}")


def flags(s: dict, num_layers: int, mt_task: str = MT_TASK, multitask: bool = False) -> Dict[str, List[str]]:
    """What the method changes on the shared command: ``optimizer``, ``criterion``, ``task`` flags,
    ``arch`` (None: the pretrained arch), ``restore`` (False: no --restore-file) and ``extra``;
    ``mt_task``: the target's name for ``--task glue_multitask`` (comma-separated names with ``multitask``:
    every method trains on them all at once)."""
    m = method_of(s)
    if multitask and s["method"] not in MULTITASK_METHODS:
        raise MethodError(f"--methods {setting_name(s)}: the multi-task setting runs only "
                          f"{', '.join(MULTITASK_METHODS)}")
    check(s, num_layers)
    values = {k: v for k, v in PINNED.items() if k in m.knobs}
    values.update({k: fmt(s[k]) for k in METHODS[s["method"]]})
    f = m.flags(values)
    out = {"optimizer": f["optimizer"], "criterion": ["--criterion", m.criterion or "sentence_prediction",
                                                      *f["criterion"]],
           "task": None, "arch": m.model, "restore": m.restore,
           "extra": f["extra"] + (["--lr", fmt(float(m.lr))] if m.lr else [])}  # its own lr (LoRA's)
    if uses_multitask(s) or multitask:
        out["task"] = ["--task", "glue_multitask", "--mt-tasks", mt_task] + (
            ["--mt-sampling", "uniform"] if multitask else [])
        out["criterion"] = ["--criterion", "glue_multitask", *f["criterion"]]  # its flags: the GLUE criteria's
    return out


def arch_and_task(f: Dict[str, List[str]], arch: List[str], num_classes: int = 2) -> Tuple[List[str], List[str]]:
    """The shared arch flags with the method's --arch swapped in, and its task flags
    (``--task sentence_prediction`` unless the method sets one); ``f``: :func:`flags`' result."""
    arch = list(arch)
    if f["arch"]:
        arch[arch.index("--arch") + 1] = f["arch"]
    return arch, f["task"] or ["--task", "sentence_prediction", "--num-classes", str(num_classes)]
