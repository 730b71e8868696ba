"""The catalogue of methods: one record per fine-tuning method, read by every script.

Pure Python (no torch, no fairseq import). A method is a set of the plug-in's flags on one shared
``fairseq-train`` command: which optimizer, which criterion, which model, and its knobs (each a
flag, a default and the variable the task scripts read it from). Its consumers:

the task scripts (through ``recadam_fairseq/launch``: METHOD names, variables, flags, run-directory names, run.json,
tune.sh's search ranges), the comparison (``engine/methods.py``), the benchmarks and the GPU pass, the docs' tables
and the command line (``python -m recadam_fairseq methods [NAME]``).

A record says what the method is: its flags, its knobs with their bounds, its family (the figures' panel), its
base, where it runs (the task scripts, the multi-task setting), and how its run directories are named
(:func:`parse_run_name` reads them back); the order of the records is every list's. What a consumer does with a
method is in that consumer's own table, keyed by its name: the benchmarks' and the GPU pass's rows
(``bench/bench_rows.py``), the translation comparison's methods (``compare/seq2seq.py``), the forgetting
comparison's update costs (``compare/runner.py``).

RecAdam's combinations are built (:func:`with_recadam`): ``recadam-X`` is X with RecAdam's optimizer and knobs
(``recadam+X``, the old spelling, still taken). ``recadam-ewc`` is named so without being one (EWC's Fisher inside
RecAdam's pull; ``ewc`` is the coupled loss over adam: both would pull twice). Adding a method: ARCHITECTURE.md's
worked example. WiSE-FT is no method (no training): a :class:`Tool` on a finished run.
"""

import os
import re
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Tuple


class UnknownMethod(ValueError):
    """A name that is no method of the catalogue; the message lists the known ones."""


@dataclass(frozen=True)
class Space:
    """Where tune.sh searches a knob (scripts/glue/tune.sh, launch/space.py): ``low`` to ``high`` (text, in the knob's
    values; ``layers``: the encoder's), on a log scale or not (a word knob: among its ``choices``); ``relative``:
    fractions of the run's updates (t0). ``searched``: by default; False: only when its ``<VAR>_RANGE`` is set."""

    low: str = ""
    high: str = ""
    log: bool = False
    relative: bool = False
    searched: bool = True


@dataclass(frozen=True)
class Knob:
    """One setting of a method: its flag, its default, where the scripts read it and where tune.sh searches it."""
    key: str  # its name in the comparison's specs (recadam:k=0.1,t0=50) and in run.json's settings
    var: str  # the task scripts' environment variable
    default: str  # the task scripts' default, as the text they pass on
    type: type  # float, int or str: what a value must parse as
    flag: str  # the fairseq-train flag it sets
    help: str
    # where its flags go: optimizer, criterion or extra (the model's); recadam: where RecAdam lives (the optimizer,
    # or the criterion for the coupled objective)
    group: str = "recadam"
    off_default: str = ""  # a valid value other than the default (the tests' knob turned)
    label: Optional[str] = None  # its word in the comparison's labels (default: key)
    # the values the comparison takes: (interval, what) with "layers" for the encoder's; unbounded: [0, inf)
    bounds: Optional[Tuple[str, str]] = None
    tag: Optional[str] = None  # its prefix in the task scripts' run-directory names; None: not in the name
    tag_if_changed: bool = False  # in the name only when it is not the default (GAMMA, ANNEAL_FUN)
    json: Optional[str] = None  # its key in run.json (default: key)
    implicit: bool = False  # the default is the flag's own: the scripts add the flag only when the variable is set
    render: Optional[Callable[[str], List[str]]] = None  # flags for a value, when not [flag, value]
    name_part: Optional[Callable[[str], str]] = None  # its value in run names, when not the value itself
    checks: Optional[Callable[[str], Optional[str]]] = None  # why a value (of the right type) cannot be used, or None
    choices: Tuple[str, ...] = ()  # a word knob's values (its run-name part is then one of them)
    # where tune.sh searches it; None: never (pinned at its default or its variable): a knob not in run names (no tag)
    # cannot be searched, two trials would share a run directory
    space: Optional[Space] = None

    def flags(self, value: str) -> List[str]:
        return self.render(value) if self.render else [self.flag, value]

    def check(self, value: str) -> str:
        """``value`` if it parses as the knob's type (and passes its ``checks``), else a one-line reason."""
        if self.type is not str:
            try:
                self.type(value)
            except ValueError:
                raise ValueError(f"{self.var}={value!r} is not {'an integer' if self.type is int else 'a number'}") from None
        why = self.checks(value) if self.checks else None
        if self.choices and value not in self.choices:
            why = f"not one of {', '.join(self.choices)}"
        if why:
            raise ValueError(f"{self.var}={value}: {why}")
        return value

    def out_of_bounds(self, value: float, num_layers: int) -> Optional[str]:
        """Why the comparison cannot take ``value`` (its :attr:`bounds`; ``layers``: ``num_layers``), or None."""
        if not self.bounds:
            return None
        interval, what = self.bounds
        lo, hi = (x.strip() for x in interval[1:-1].split(","))
        top = num_layers if hi == "layers" else float(hi)
        ok = (value > float(lo) if interval[0] == "(" else value >= float(lo)) and (
            value < top if interval[-1] == ")" else value <= top)
        if ok:
            return None
        if hi == "layers":
            return f"{value} {what}, the encoder has {num_layers}"
        return f"{what} must be " + ((f"> {lo}" if interval[0] == "(" else f">= {lo}") if hi == "inf"
                                     else f"in {interval}")


def _fisher_name(value: str) -> str:
    """A Fisher file in run names: its file name without the extension (``task`` is the default, not named)."""
    return os.path.splitext(os.path.basename(value))[0]


def _fisher_check(value: str) -> Optional[str]:
    return None if value == "task" or os.path.isfile(value) else \
        "no such file (write one with scripts/fisher.py, or EWC_FISHER=task)"


def _frozen_layers(embeddings: bool) -> Callable[[str], List[str]]:
    """--freeze-encoder-layers 0..N-1 (and the embeddings) for N frozen layers; nothing for 0."""
    def render(value: str) -> List[str]:
        n = int(value)
        return (["--freeze-encoder-layers", f"0-{n - 1}"] + (["--freeze-embeddings"] if embeddings else [])) if n else []
    return render


SCHEDULES = ("sigmoid", "linear", "constant")
KNOBS: Dict[str, Knob] = {k.key: k for k in (
    Knob("anneal_fun", "ANNEAL_FUN", "sigmoid", str, "--recadam-anneal-fun", "λ(t)'s schedule: sigmoid, linear "
         "or constant", tag="", tag_if_changed=True, off_default="linear", choices=SCHEDULES,
         space=Space(searched=False)),
    Knob("k", "K", "0.1", float, "--recadam-anneal-k", "the slope of the sigmoid λ(t)", tag="k", off_default="0.3",
         bounds=("(0, inf)", "k"), space=Space("0.01", "1", log=True)),
    Knob("t0", "T0", "1000", float, "--recadam-anneal-t0", "the update where λ(t) = 1/2", tag="t", off_default="77",
         bounds=("(0, inf)", "t0"), space=Space("0.05", "0.8", relative=True)),
    Knob("gamma", "GAMMA", "5000", float, "--recadam-pretrain-cof", "γ: the pull toward θ*", tag="g", label="γ",
         tag_if_changed=True, off_default="123", bounds=("[0, inf)", "γ"), space=Space("100", "10000", log=True)),
    Knob("lambda", "R3F_LAMBDA", "0.7", float, "--r3f-lambda", "the weight of R3F's consistency term",
         tag="lambda", tag_if_changed=True, json="r3f_lambda", group="criterion", off_default="0.2", label="λ",
         bounds=("[0, inf)", "R3F's λ"), space=Space("0.1", "5", log=True)),
    Knob("eps", "R3F_EPS", "1e-05", float, "--eps", "the range of R3F's noise on the embeddings", json="r3f_eps",
         implicit=True, group="criterion", off_default="2e-05", bounds=("(0, inf)", "R3F's noise range")),
    Knob("rho", "RHO", "0.05", float, "--rho", "SAM's radius ρ", tag="rho", group="optimizer", off_default="0.11",
         label="ρ", bounds=("(0, inf)", "ρ"), space=Space("0.01", "0.5", log=True)),
    Knob("keep_ratio", "KEEP_RATIO", "0.1", float, "--keep-ratio", "FSAM: the fraction of weights perturbed",
         group="optimizer", off_default="0.2", bounds=("(0, 1]", "the kept fraction")),
    Knob("mask_iter_e", "MASK_ITER_E", "100", int, "--mask-iter-e", "FSAM: updates between Fisher masks",
         group="optimizer", off_default="7", bounds=("[1, inf)", "the updates between masks")),
    Knob("decay", "LLRD", "0.9", float, "--layer-lr-decay", "the lr factor per layer, top down", tag="d",
         json="layer_lr_decay", group="optimizer", off_default="0.8", label="lr decay",
         bounds=("(0, 1]", "the lr decay"), space=Space("0.5", "1")),
    Knob("reinit", "REINIT", "2", int, "--reinit-layers", "top encoder layers re-initialised", tag="n",
         json="reinit_layers", group="extra", off_default="1", label="re-initialised layers",
         bounds=("(0, layers]", "re-initialised layers"), space=Space("1", "layers")),
    Knob("rank", "LORA_RANK", "8", int, "--lora-rank", "LoRA's rank r", tag="r", json="lora_rank", group="extra",
         off_default="4", label="r", bounds=("[1, inf)", "the rank"), space=Space("1", "64", log=True)),
    Knob("lora_alpha", "LORA_ALPHA", "8", float, "--lora-alpha", "LoRA's scale α (the update is α/r·BA)",
         tag="a", group="extra", off_default="16", bounds=("(0, inf)", "LoRA's α"),
         space=Space("1", "64", log=True, searched=False)),
    Knob("p", "MIXOUT", "0.9", float, "--mixout", "Mixout's probability of swapping in θ*", tag="p",
         json="mixout", group="extra", off_default="0.5", bounds=("[0, 1)", "the mixout probability"),
         space=Space("0.1", "0.9")),
    Knob("ratio", "CHILD_RATIO", "0.3", float, "--child-tuning-ratio", "ChildTuning: the fraction of the "
         "gradient kept", tag="p", json="child_tuning_ratio", group="optimizer", off_default="0.2", label="kept",
         bounds=("(0, 1]", "the kept fraction"), space=Space("0.05", "0.5", log=True)),
    Knob("alpha", "RDROP_ALPHA", "1.0", float, "--rdrop-alpha", "R-Drop's weight α", tag="a", json="rdrop_alpha",
         group="criterion", off_default="0.5", label="α", bounds=("[0, inf)", "R-Drop's α"),
         space=Space("0.1", "5", log=True)),
    Knob("layers", "FREEZE", "3", int, "--freeze-encoder-layers", "the embeddings and encoder layers 0..N-1 "
         "frozen", tag="freeze", render=_frozen_layers(embeddings=True), group="extra", off_default="1",
         label="frozen layers", bounds=("[0, layers]", "frozen layers")),
    Knob("freeze", "FREEZE", "0", int, "--freeze-encoder-layers", "encoder layers 0..N-1 frozen", tag="freeze",
         render=_frozen_layers(embeddings=False), group="extra", off_default="1", label="frozen layers",
         bounds=("[0, layers]", "frozen layers")),
    Knob("fisher", "EWC_FISHER", "task", str, "--ewc-fisher", "EWC's F: task (the training set's, before update 1) "
         "or a file of scripts/fisher.py", tag="F", tag_if_changed=True, json="ewc_fisher", name_part=_fisher_name,
         checks=_fisher_check, off_default="rte-fisher.pt"),  # (its off-default: a file the tests make)
)}
# the learning rate, searched by tune.sh for every method (LR_RANGE); named in a search's run names (-lr2e-05)
LR_SPACE = Space("1e-5", "1e-3", log=True)
LR_TAG = "lr"
RECADAM_KNOBS = ("anneal_fun", "k", "t0", "gamma")  # in the order of their flags
_RECADAM_NAME_ORDER = ("k", "t0", "gamma", "anneal_fun")  # in run names: recadam-k0.5-t250-g1000-linear
# the optimizer a method runs on, as flags; recadam-w0: RecAdam at w = 0 is fairseq's adam bit for bit, with
# the optimizer-side listeners (LLRD's lr scales, ChildTuning's masks) that fairseq's adam does not have
OPTIMIZERS = {"adam": ["--optimizer", "adam"], "recadam": ["--optimizer", "recadam"],
              "recadam-w0": ["--optimizer", "recadam", "--recadam-anneal-w", "0"], "samsgd": ["--optimizer", "samsgd"]}
MODELS = {"roberta_ft": "--arch roberta_ft_* (fairseq's RoBERTa with re-init, LoRA and Mixout)",
          "ca_mtl_roberta": "--arch ca_mtl_roberta_* (CA-MTL's task-conditioned encoder)"}


@dataclass(frozen=True)
class Method:
    """One method: what it adds to the shared command, in three groups each consumer places: ``optimizer``
    (``--optimizer`` and its flags), ``criterion`` (the criterion's flags; ``criterion`` names it), ``extra``."""

    name: str
    summary: str  # one line, for the tables
    optimizer: str  # a key of OPTIMIZERS
    knobs: Tuple[str, ...] = ()  # in the order of its flags (and of the comparison's positional VALUES)
    optimizer_fixed: Tuple[str, ...] = ()  # flags always added after --optimizer (e.g. --sam-type sam)
    criterion: Optional[str] = None  # the GLUE criterion it needs (None: the consumer's default)
    criterion_head: Tuple[str, ...] = ()  # flags always added right after the criterion's name
    criterion_fixed: Tuple[str, ...] = ()  # flags always added to the criterion's, after its knobs
    extra_fixed: Tuple[str, ...] = ()  # model flags always added, after its knobs
    model: Optional[str] = None  # a key of MODELS: the model it needs (None: fairseq's RoBERTa)
    task: Optional[str] = None  # the fairseq task it needs (None: sentence_prediction)
    lr: Optional[str] = None  # its own lr, instead of the recipe's (LoRA)
    restore: bool = True  # False: no --restore-file (random init; θ* from --recadam-pretrained-path)
    base: str = "adam"  # what its cost and results are compared with
    multitask: bool = False  # runs in the multi-task setting (--task glue_multitask, every task at once)
    refuses: Tuple[Tuple[str, str], ...] = ()  # (method, why): combinations it stops with one line
    page: str = ""  # its page in docs/
    family: str = ""  # the figures' panel it is drawn in, with its kin (RecAdam + X: X's); default: its name
    # where RecAdam's knobs go: the optimizer (the decoupled pull), or the criterion (the coupled objective)
    recadam_in: str = "optimizer"
    scripts: bool = True  # a METHOD of finetune.sh and grid.sh
    aliases: Tuple[str, ...] = ()  # old spellings of its name, still taken (recadam+r3f)
    composed_of: Optional[str] = None  # X when this is RecAdam + X (built by with_recadam)

    @property
    def needs_ft(self) -> bool:
        return self.model == "roberta_ft"

    @property
    def seq2seq(self) -> bool:
        """A METHOD of scripts/seq2seq/finetune.sh: not RoBERTa's model or head, not the multi-task setting, not EWC's
        task Fisher (not wired there; docs/seq2seq.md's comparison gives it a file of scripts/fisher.py)."""
        return (self.scripts and self.model is None and self.task is None and not self.extra_fixed
                and "fisher" not in self.knobs)

    @property
    def seq2seq_criterion(self) -> str:
        """Its criterion on --task translation: the twin of its GLUE one, the same terms over fairseq's
        label-smoothed cross-entropy (label_smoothed_cross_entropy_recadam's default is fairseq's criterion)."""
        return SEQ2SEQ_CRITERIA[self.criterion]

    @property
    def uses_recadam(self) -> bool:
        """RecAdam's λ(t) and pull, with its knobs (k, t0, γ)."""
        return "k" in self.knobs

    @property
    def panel(self) -> str:
        """Its family: the figures' panel it is drawn in."""
        return self.family or self.name

    def defaults(self) -> Dict[str, str]:
        """The knobs' values when no variable is set: the flags the scripts pass (an implicit knob's none)."""
        return {k: KNOBS[k].default for k in self.knobs if not KNOBS[k].implicit}

    def flags(self, values: Mapping[str, str]) -> Dict[str, List[str]]:
        """The method's flags for knob ``values`` (text, as given; a knob that is absent adds no flag):
        ``{"optimizer": [...], "criterion": [...], "extra": [...]}``, each group in the order
        head, RecAdam's knobs (where RecAdam lives: the optimizer, or the criterion for the coupled
        objective), then the fixed flags and the method's other knobs. The criterion's own name is
        :attr:`criterion`; ``criterion`` here holds the flags that follow it."""
        out = {"optimizer": list(OPTIMIZERS[self.optimizer]), "criterion": list(self.criterion_head), "extra": []}
        fixed = {"optimizer": self.optimizer_fixed, "criterion": self.criterion_fixed, "extra": self.extra_fixed}
        recadam_group = self.recadam_in
        own = {"optimizer": [], "criterion": [], "extra": []}
        for key in self.knobs:
            if key in values:
                group = recadam_group if KNOBS[key].group == "recadam" else KNOBS[key].group
                (out if key in RECADAM_KNOBS else own)[group] += KNOBS[key].flags(str(values[key]))
        # the optimizer's fixed flags pick its variant (--sam-type, --child-tuning), which its knobs then tune
        return {g: out[g] + (list(fixed[g]) + own[g] if g == "optimizer" else own[g] + list(fixed[g])) for g in out}

    def all_flags(self, values: Mapping[str, str]) -> List[str]:
        """Every flag the method adds (its criterion included), in one list."""
        f = self.flags(values)
        return f["optimizer"] + (["--criterion", self.criterion] if self.criterion else []) + f["criterion"] + f["extra"]

    def run_name(self, values: Mapping[str, str], explicit: bool = False) -> str:
        """A run directory's name (:func:`parse_run_name` reads it back): the method, then each named knob as its tag
        and value, RecAdam's first: ``recadam-k0.1-t1000``, ``sam-rho0.05``, ``lora-r8-a8``. The task scripts name
        every knob but those left out at their default (γ, λ(t)'s schedule, R3F's λ); ``explicit`` (the
        comparison's): exactly the knobs of ``values``, at whatever value. (A search's runs add their lr last,
        ``-lr2e-05``: launch/glue.py.)"""
        name = self.name
        for key in self.name_order():
            k = KNOBS[key]
            if k.tag is None or (explicit and key not in values):
                continue
            value = str(values[key] if explicit else values.get(key, k.default))
            if not explicit and k.tag_if_changed and value == k.default:
                continue
            name += f"-{k.tag}{k.name_part(value) if k.name_part and not value.startswith('$') else value}"
        return name

    def name_order(self) -> List[str]:
        """Its knobs in the order of its run names: RecAdam's first (k, t0, γ, λ(t)'s schedule), then its own."""
        recadam = [k for k in _RECADAM_NAME_ORDER if k in self.knobs]
        return recadam + [k for k in self.knobs if k not in recadam]

    def settings(self, values: Mapping[str, str]) -> Dict[str, str]:
        """run.json's settings of the method: each knob under its json key, and the fixed choices."""
        out = {}
        fixed = list(self.optimizer_fixed) + list(self.criterion_head) + list(self.criterion_fixed)
        for flag, key in (("--noise-type", "noise_type"), ("--child-tuning", "child_tuning"), ("--sam-type", "sam_type")):
            if flag in fixed:
                out[key] = fixed[fixed.index(flag) + 1]
        for key in self.knobs:
            if key in values:
                out[KNOBS[key].json or key] = str(values[key])
        return out


# the GLUE criteria's twins on --task translation (None: the consumer's default)
SEQ2SEQ_CRITERIA = {None: "label_smoothed_cross_entropy_recadam",
                    "sentence_prediction_recadam": "label_smoothed_cross_entropy_recadam",
                    "sentence_prediction_r3f": "label_smoothed_cross_entropy_r3f",
                    "sentence_prediction_rdrop": "label_smoothed_cross_entropy_rdrop"}

SAM_KNOBS = ("rho", "keep_ratio", "mask_iter_e")


@dataclass(frozen=True)
class WithRecAdam:
    """RecAdam + an earlier record (:func:`with_recadam`) at this place in the order."""

    of: str


# the records, in the catalogue's order (the scripts' --help, the tables, the comparison's figures)
_RECORDS: List[object] = [
    Method("adam", "fairseq's Adam (AdamW): the baseline", "adam", base="", multitask=True, page="glue.md"),
    Method("recadam", "RecAdam: Adam with λ(t) and a decoupled pull toward the pretrained weights θ*", "recadam",
           knobs=RECADAM_KNOBS, multitask=True, page="recadam.md"),
    Method("recadam-coupled", "the authors' coupled objective λ(t)·L + (1−λ(t))·γ/2·‖θ−θ*‖² in the loss, over "
           "fairseq's adam", "adam", knobs=RECADAM_KNOBS, criterion="sentence_prediction_recadam",
           criterion_head=("--recadam-objective", "coupled"), recadam_in="criterion", base="recadam",
           page="recadam.md", family="recadam"),
    Method("recadam-random-init", "RecAdam from random weights (no --restore-file): the pull recalls θ* (the "
           "paper's choice)", "recadam", knobs=RECADAM_KNOBS, restore=False, base="recadam", scripts=False,
           page="recadam.md", family="recadam"),
    Method("ewc", "EWC: the coupled objective with the penalty weighted by the task's diagonal Fisher at θ*, "
           "γ/2·Σ F·(θ−θ*)² (Kirkpatrick et al. 2017), over fairseq's adam", "adam", knobs=RECADAM_KNOBS + ("fisher",),
           criterion="sentence_prediction_recadam", criterion_head=("--recadam-objective", "coupled"),
           recadam_in="criterion", base="recadam-coupled", multitask=True, page="ewc.md"),
    Method("recadam-ewc", "RecAdam with EWC's Fisher: the decoupled pull weighted per element by the task's "
           "diagonal Fisher at θ*", "recadam", knobs=RECADAM_KNOBS + ("fisher",), base="recadam", multitask=True,
           page="ewc.md", family="ewc"),
    Method("r3f", "R3F: a consistency term under noise on the embeddings (Aghajanyan et al. 2021)", "adam",
           knobs=("lambda", "eps"), criterion="sentence_prediction_r3f", criterion_fixed=("--noise-type", "uniform"),
           refuses=(("rdrop", "R3F and R-Drop each add a consistency term on a second forward"),), page="r3f.md"),
    Method("r4f", "R4F: R3F with a spectrally normalised classification head", "adam", knobs=("lambda", "eps"),
           criterion="sentence_prediction_r3f", criterion_fixed=("--noise-type", "uniform"),
           extra_fixed=("--spectral-norm-classification-head",), page="r3f.md", family="r3f"),
    WithRecAdam("r3f"),
    Method("sam", "SAM: sharpness-aware minimisation over Adam (Foret et al. 2021); --sam-type esam, gsam: ESAM, GSAM",
           "samsgd", knobs=("rho",), optimizer_fixed=("--sam-type", "sam"), page="sam.md"),
    Method("fsam", "FSAM: SAM perturbing the top weights by Fisher information (Zhong et al. 2022); fisher-esam, "
           "fisher-gsam", "samsgd", knobs=SAM_KNOBS, optimizer_fixed=("--sam-type", "fisher-sam"), page="sam.md",
           family="sam"),
    WithRecAdam("fsam"),
    Method("freeze", "the embeddings and encoder layers 0..N-1 frozen (through --task glue_multitask)", "adam",
           knobs=("layers",), task="glue_multitask", multitask=True, scripts=False, page="ca-mtl.md",
           family="ca-mtl"),
    Method("ca-mtl", "CA-MTL's task-conditioned encoder, encoder layers 0..N-1 frozen (Pilault et al. 2021)",
           "adam", knobs=("freeze",), model="ca_mtl_roberta", task="glue_multitask", base="freeze", multitask=True,
           scripts=False, page="ca-mtl.md"),
    WithRecAdam("ca-mtl"),
    # recadam at w = 0: Adam's update, no θ*
    Method("llrd", "layer-wise lr decay: each layer's lr the one above it times the decay", "recadam-w0",
           knobs=("decay",), page="llrd.md"),
    WithRecAdam("llrd"),
    Method("reinit", "the top encoder layers re-initialised (Zhang et al. 2021)", "adam", knobs=("reinit",),
           model="roberta_ft", page="reinit.md"),
    WithRecAdam("reinit"),
    Method("lora", "LoRA on attention q and v, the encoder frozen (Hu et al. 2021)", "adam",
           knobs=("rank", "lora_alpha"), model="roberta_ft", lr="5e-4",
           refuses=(("recadam", "LoRA freezes the pretrained weights: there is nothing for the pull to hold"),),
           page="lora.md"),
    Method("mixout", "Mixout toward θ* on the encoder's linear layers (Lee et al. 2020)", "adam", knobs=("p",),
           model="roberta_ft", page="mixout.md"),
    WithRecAdam("mixout"),  # the targets are θ*: one copy
    Method("childtune-d", "ChildTuning-D: the gradient masked to its top Fisher entries (Xu et al. 2021)",
           "recadam-w0", knobs=("ratio",), optimizer_fixed=("--child-tuning", "D"), page="child-tuning.md",
           family="child-tuning"),
    Method("childtune-f", "ChildTuning-F: the gradient masked at random each update", "recadam-w0",
           knobs=("ratio",), optimizer_fixed=("--child-tuning", "F"), page="child-tuning.md", family="child-tuning"),
    WithRecAdam("childtune-d"),
    Method("rdrop", "R-Drop: two dropout passes and their symmetric KL (Liang et al. 2021)", "adam",
           knobs=("alpha",), criterion="sentence_prediction_rdrop", page="rdrop.md"),
    WithRecAdam("rdrop"),
]


def with_recadam(m: Method) -> Method:
    """RecAdam + ``m``: ``m``'s flags on RecAdam's optimizer (λ(t) and the pull), RecAdam's knobs first, drawn in
    ``m``'s panel."""
    why = dict(m.refuses).get("recadam")
    if why:
        raise UnknownMethod(f"recadam-{m.name}: {m.name} does not combine with RecAdam ({why})")
    return replace(m, name=f"recadam-{m.name}", summary=f"RecAdam with {m.name}", optimizer="recadam",
                   knobs=RECADAM_KNOBS + m.knobs, base="recadam", aliases=(f"recadam+{m.name}",),
                   composed_of=m.name, family=m.panel, recadam_in="optimizer",
                   multitask=m.multitask and m.name != "freeze")


METHODS: Dict[str, Method] = {}
ALIASES: Dict[str, str] = {}


def register(*records) -> None:
    """Add records (a :class:`Method`, or :class:`WithRecAdam` of one already in) after the others: the
    package's own at import, a throwaway one in the tests."""
    for r in records:
        m = with_recadam(METHODS[r.of]) if isinstance(r, WithRecAdam) else r
        if m.name in METHODS:
            raise ValueError(f"method {m.name!r} is in the catalogue twice")
        METHODS[m.name] = m
        ALIASES.update((a, m.name) for a in m.aliases)


register(*_RECORDS)


@dataclass(frozen=True)
class Tool:
    """Not a method: something done to a finished run, with no training (its row in the README's table)."""

    name: str
    title: str
    summary: str
    command: str
    page: str


TOOLS: Dict[str, Tool] = {t.name: t for t in (
    Tool("wise-ft", "WiSE-FT", "(1−α)·θ* + α·θ_ft after training: no training at all",
         "scripts/interpolate.py CKPT --pretrained PT --alpha 0.5 --out OUT", "wise-ft.md"),
)}


def names(scripts: Optional[bool] = None, seq2seq: bool = False) -> List[str]:
    """Every method's name, in order (``scripts=True``: the task scripts'; ``seq2seq``: seq2seq/finetune.sh's)."""
    return [n for n, m in METHODS.items() if (scripts is None or m.scripts == scripts) and (m.seq2seq or not seq2seq)]


def position(name: str) -> int:
    """Where ``name`` (a method or an alias of it) stands in the catalogue's order; after every method if unknown."""
    n = ALIASES.get(name, name)
    return list(METHODS).index(n) if n in METHODS else len(METHODS)


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _name_pattern(m: Method) -> "re.Pattern":
    """What follows ``m``'s name in its run names (:meth:`Method.run_name`), each knob a named group that a name may
    leave out (the task scripts' names leave out γ at its default, the comparison's the knobs it pins)."""
    parts = []
    for key in m.name_order():
        k = KNOBS[key]
        if k.tag is None:
            continue
        value = ("|".join(map(re.escape, k.choices)) if k.choices else ".+?" if k.name_part
                 else "[^-]+" if k.type is str else _NUMBER)
        parts.append(f"(?:-{re.escape(k.tag)}(?P<{key}>{value}))?")
    parts.append(f"(?:-{LR_TAG}(?P<lr>{_NUMBER}))?")  # a search's runs name their lr last
    return re.compile("".join(parts))


def parse_run_name(name: str) -> Tuple[str, Dict[str, str]]:
    """A run directory's name, a user's grid's, a search's or the comparison's -> (method, {knob: its value as named}):
    ``recadam-fsam-k0.1-t1000-rho0.05`` -> (``recadam-fsam``, {k: 0.1, t0: 1000, rho: 0.05}); the knobs a name
    leaves out are absent; a search's lr is ``lr``. A name whose settings do not parse keeps its longest method (and
    no settings); a name of no method is its own."""
    first = None
    for m in sorted(METHODS.values(), key=lambda m: -len(m.name)):
        if name == m.name:
            return name, {}
        if name.startswith(m.name + "-"):
            found = _name_pattern(m).fullmatch(name[len(m.name):])
            if found:
                return m.name, {k: v for k, v in found.groupdict().items() if v is not None}
            first = first or m.name
    return first or name, {}


def closest(name: str, among=None) -> Optional[str]:
    """The known name a mistyped ``name`` most likely meant (``recadm`` -> ``recadam``), or None."""
    import difflib

    found = difflib.get_close_matches(name.lower(), list(among or [*METHODS, *ALIASES]), n=1, cutoff=0.75)
    return found[0] if found else None


def get(name: str) -> Method:
    """The method called ``name`` (or an alias of it); UnknownMethod names the likeliest one meant, and the known."""
    m = METHODS.get(ALIASES.get(name, name))
    if m is None:
        near = closest(name)
        raise UnknownMethod(f"unknown method {name!r}" + (f" (did you mean {near!r}?)" if near else "")
                            + f"; known: {', '.join(METHODS)}")
    return m
