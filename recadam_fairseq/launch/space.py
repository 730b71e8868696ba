"""tune.sh's search space: for each method, the dimensions it searches (its knobs' ranges from the catalogue, or the
user's ``<VAR>_RANGE``, and the learning rate, which every method searches: LR_RANGE), the knobs pinned by their
variable (K=0.1 pins k), and a trial's values drawn from an Optuna trial, written as the variables finetune.sh reads.

A value is drawn on its scale (log where the range spans decades), then written to three significant figures (an
integer knob: a whole number): the run's name holds it (recadam-k0.123-t57-lr2.1e-05) and the run trains at it. t0 is
drawn as a fraction of the run's updates (T0_RANGE too), the run gets the whole update."""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from recadam_fairseq import catalogue

from .spec import Stop

LR = "lr"


@dataclass(frozen=True)
class Dim:
    """One searched dimension: a knob's key (or ``lr``), its variable, type and range on its scale."""

    key: str
    var: str
    type: type
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: Tuple[str, ...] = ()
    relative: bool = False

    @property
    def param(self) -> str:
        """Its name in the Optuna study (t0 is a fraction there: ``t0_fraction``)."""
        return f"{self.key}_fraction" if self.relative else self.key

    def draw(self, trial) -> object:
        """Its value from an Optuna trial (``suggest_*``), as the study records it."""
        if self.choices:
            return trial.suggest_categorical(self.param, list(self.choices))
        if self.type is int:
            return trial.suggest_int(self.param, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.param, self.low, self.high, log=self.log)

    def text(self, drawn, updates: int) -> str:
        """The value the run gets, as text: three significant figures, a whole number for an integer knob or t0."""
        if self.choices:
            return str(drawn)
        if self.relative:
            return str(max(1, int(round(float(drawn) * updates))))
        if self.type is int:
            return str(int(drawn))
        return three_figures(float(drawn))

    def shown(self, updates: int) -> str:
        """The range in the summary's words."""
        if self.choices:
            return " | ".join(self.choices)
        if self.relative:
            return f"{self.low:g} to {self.high:g} of {updates} updates"
        return f"{self.low:g} to {self.high:g}" + (" (log)" if self.log else "")


def three_figures(x: float) -> str:
    """``x`` to three significant figures, one text a value: e-notation below 1e-3 (an lr: 2.13e-05, 1.5e-04), plain
    digits from there (a k: 0.0518, 0.5; a γ: 1230, 10000)."""
    r = float(f"{x:.3g}")
    if r == 0 or abs(r) >= 1e-3:
        return format(r, ".15g")
    mantissa, exponent = f"{r:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


def _number(text: str, what: str, integer: bool) -> float:
    try:
        x = float(text)
    except ValueError:
        raise Stop(f"{what}: '{text}' is not a number") from None
    if integer and x != int(x):
        raise Stop(f"{what}: '{text}' is not an integer")
    return x


def parse_range(var: str, text: str, space: catalogue.Space, knob: Optional[catalogue.Knob], layers: int) -> Dim:
    """``<VAR>_RANGE``'s text (``LOW HIGH``, or a word knob's choices) as a dimension; Stop (one line) for an empty
    range, a bound the knob does not take, or a log scale from 0."""
    name = f"{var}_RANGE={text!r}"
    key = knob.key if knob else LR
    typ = knob.type if knob else float
    words = text.split()
    if knob is not None and knob.choices:
        if not words:
            raise Stop(f"{name}: an empty range: give some of {' '.join(knob.choices)}")
        for w in words:
            try:
                knob.check(w)
            except ValueError as e:
                raise Stop(f"{name}: {e}") from None
        return Dim(key, var, typ, choices=tuple(dict.fromkeys(words)))
    if len(words) != 2:
        example = f"{space.low} {space.high}".replace("layers", str(layers))
        raise Stop(f"{name}: give LOW HIGH, e.g. {var}_RANGE=\"{example}\"")
    low, high = (_number(w, name, typ is int and not space.relative) for w in words)
    if low >= high:
        raise Stop(f"{name}: an empty range (LOW must be below HIGH; to fix the value, set {var} instead)")
    if space.log and low <= 0:
        raise Stop(f"{name}: searched on a log scale, LOW must be above 0")
    if space.relative:
        if not (0 < low and high <= 1):
            raise Stop(f"{name}: fractions of the run's updates, in (0, 1]")
    elif knob is not None:
        for x in (low, high):
            why = knob.out_of_bounds(x, layers)
            if why:
                raise Stop(f"{name}: {why}")
    elif low <= 0:
        raise Stop(f"{name}: the learning rate must be above 0")
    return Dim(key, var, typ, low, high, space.log, relative=space.relative)


def default_dim(space: catalogue.Space, knob: Optional[catalogue.Knob], layers: int) -> Dim:
    """The catalogue's range of a knob (``layers``: the encoder's, for a range up to it), or LR_SPACE's."""
    if knob is not None and knob.choices:
        return Dim(knob.key, knob.var, knob.type, choices=knob.choices)
    high = float(layers) if space.high == "layers" else float(space.high)
    if knob is None:
        return Dim(LR, "LR", float, float(space.low), high, space.log)
    return Dim(knob.key, knob.var, knob.type, float(space.low), high, space.log, relative=space.relative)


@dataclass
class MethodSpace:
    """What a method's trials vary: ``dims`` (lr first, then its knobs in the catalogue's order); ``pinned``: the
    knobs whose variable is set (their value, as the variable says it)."""

    method: str
    dims: List[Dim]
    pinned: Dict[str, str]

    def values(self, trial, updates: int) -> Dict[str, str]:
        """A trial's variables for finetune.sh (LR, K, T0, ...): each dimension drawn from ``trial``."""
        return {d.var: d.text(d.draw(trial), updates) for d in self.dims}

    def values_of(self, params: Mapping[str, object], updates: int) -> Dict[str, str]:
        """The variables of a trial already drawn (its Optuna ``params``): a run resumed by a later command."""
        return {d.var: d.text(params[d.param], updates) for d in self.dims}


def spaces(methods: List[str], env: Mapping[str, str], layers: int) -> Dict[str, MethodSpace]:
    """Each method's space under ``env``: a knob whose variable is set is pinned there (it is not searched); one with
    ``<VAR>_RANGE`` is searched in that range, one the catalogue searches by default in its range, the others stay at
    their defaults. Stop: a range for a knob no method has, a range and a value for one knob, a method with nothing
    to search."""
    import difflib

    knobs = catalogue.KNOBS
    used = {k for m in methods for k in catalogue.get(m).knobs}
    ranges = {f"{k.var}_RANGE": k for k in knobs.values()}
    searched = ["LR_RANGE"] + sorted({r for r, k in ranges.items() if k.key in used and k.space is not None})
    for var in sorted(v for v in env if v.endswith("_RANGE") and env.get(v)):
        knob = ranges.get(var)
        if var == "LR_RANGE":
            pass
        elif knob is None:  # another program's variable, unless it looks like one of ours mistyped
            near = difflib.get_close_matches(var, searched, n=1, cutoff=0.8)
            if near:
                raise Stop(f"{var}: no knob is searched so (did you mean {near[0]}?)")
            continue
        elif knob.key not in used:
            raise Stop(f"{var}: none of METHODS ({' '.join(methods)}) has {knob.key}")
        elif knob.space is None:
            raise Stop(f"{var}: {knob.key} is not searched (its value is not in a run's name: two trials would share "
                       f"a run directory): set {knob.var} to fix it")
        value_var = var[:-len("_RANGE")]
        if env.get(value_var):
            raise Stop(f"{value_var}={env[value_var]} fixes it and {var} searches it: give one")
    dims: Dict[str, Dim] = {}

    def dim(knob: Optional[catalogue.Knob]) -> Optional[Dim]:
        key = knob.key if knob else LR
        if key not in dims:
            space = knob.space if knob else catalogue.LR_SPACE
            var = knob.var if knob else "LR"
            given = env.get(f"{var}_RANGE")
            if env.get(var) or space is None or not (given or space.searched):
                dims[key] = None
            else:
                dims[key] = parse_range(var, given, space, knob, layers) if given else default_dim(space, knob, layers)
        return dims[key]

    out = {}
    for name in methods:
        m = catalogue.get(name)
        ds = [d for d in [dim(None)] + [dim(knobs[k]) for k in m.knobs] if d is not None]
        pinned = {k: env[knobs[k].var] for k in m.knobs if env.get(knobs[k].var)}
        if not ds:
            fixed = ["LR"] + [knobs[k].var for k in m.knobs if env.get(knobs[k].var)]
            raise Stop(f"METHODS: {name} has nothing to search ({', '.join(fixed)} set): unset {fixed[0]} to search it")
        out[name] = MethodSpace(name, ds, pinned)
    return out


def needs_layers(methods: List[str]) -> bool:
    """Whether a range of these methods' goes up to the encoder's layers (re-init): the checkpoint is read then."""
    return any(catalogue.KNOBS[k].space is not None and catalogue.KNOBS[k].space.high == "layers"
               for m in methods for k in catalogue.get(m).knobs)

