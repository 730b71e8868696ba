"""Which (setting, seed) one invocation runs: the default grids of each task, the third seeds, the
intermediate points measured along a run, and the rule that picks each method's setting for the other tasks."""

from recadam_fairseq import catalogue
from recadam_fairseq.engine import methods

DEFAULT_METHODS = (
    "adam",
    "recadam:0.1:25", "recadam:0.1:50", "recadam:0.1:100", "recadam:0.1:50:0", "recadam:0.1:100:0",
    "recadam-coupled:0.1:50", "recadam-random-init:0.1:50",
    "ewc:0.1:50:5", "ewc:0.1:50:50", "ewc:0.1:50:500", "ewc:0.1:50:5000",
    "recadam-ewc:0.1:50:500", "recadam-ewc:0.1:50:5000", "recadam-ewc:0.1:50:10000",
    "r3f:1", "r3f:5", "r4f:1",
    "sam:0.05", "sam:0.2", "fsam:0.05", "fsam:0.2",
    "recadam-r3f:k=0.1,t0=50,lambda=1", "recadam-fsam:k=0.1,t0=50,rho=0.05",
    "freeze:2", "freeze:4", "freeze:6",
    "ca-mtl:0", "ca-mtl:3",
    "llrd:0.9", "llrd:0.7", "recadam-llrd:k=0.1,t0=25,decay=0.9",
    "reinit:1", "reinit:2", "recadam-reinit:k=0.1,t0=25,reinit=1",
    "lora:8", "lora:32",
    "mixout:0.5", "mixout:0.9", "recadam-mixout:k=0.1,t0=25,p=0.9",
    "childtune-d:0.1", "childtune-d:0.3", "recadam-childtune-d:k=0.1,t0=25,ratio=0.3",
    "rdrop:1", "rdrop:5", "recadam-rdrop:k=0.1,t0=25,alpha=1",
)
# the other tasks run each method at its best setting on the movie task (best_on_movie(), checked against
# docs/forgetting.json by the tests): the least forgetting among the settings within BEST_TOLERANCE of Adam's
# accuracy, else the most accurate one; RecAdam's γ = 0 control is no candidate
TASK_METHODS = (
    "adam", "recadam:0.1:25", "recadam-coupled:0.1:50", "recadam-random-init:0.1:50",
    "ewc:0.1:50:5", "recadam-ewc:0.1:50:500", "r3f:1", "r4f:1", "sam:0.05", "fsam:0.05",
    "recadam-r3f:k=0.1,t0=50,lambda=1", "recadam-fsam:k=0.1,t0=50,rho=0.05",
    "freeze:2", "ca-mtl:0",
    "llrd:0.9", "recadam-llrd:k=0.1,t0=25,decay=0.9", "reinit:1", "recadam-reinit:k=0.1,t0=25,reinit=1", "lora:8",
    "mixout:0.5", "recadam-mixout:k=0.1,t0=25,p=0.9", "childtune-d:0.3", "recadam-childtune-d:k=0.1,t0=25,ratio=0.3",
    "rdrop:5", "recadam-rdrop:k=0.1,t0=25,alpha=1",
)
BEST_TOLERANCE = 0.01  # about 3 seed standard deviations of Adam's accuracy on the movie task (0.0035)
MULTI = "multi"  # --task: all the target tasks at once
UPDATES = 200  # per run, per task in the multi-task setting
# the multi-task setting: plain RoBERTa (adam) and CA-MTL, without and with the lower half frozen, each
# with and without RecAdam (at its movie setting), and RecAdam with t0 scaled to the 3× longer run (its
# anneal ends after the same share of it); the single-task runs to compare with are each task's own
MULTITASK_SETTINGS = ("adam", "recadam:0.1:25", "ca-mtl:0", "ca-mtl:3", "recadam-ca-mtl:k=0.1,t0=25,freeze=0",
                      "recadam-ca-mtl:k=0.1,t0=25,freeze=3", "recadam:0.1:75", "ewc:0.1:50:5", "recadam-ewc:0.1:50:500")
# WiSE-FT: each run's final checkpoint interpolated with θ* at these α (costs measuring only)
DEFAULT_ALPHAS = (0.25, 0.5, 0.75)
# the time of an update relative to Adam's where it is not about 1 (RecAdam + X: X's): the dearest runs start first
COST = {"r3f": 2, "r4f": 2, "sam": 2, "fsam": 2, "freeze": 0.5, "ca-mtl": 1.2, "rdrop": 2,
        "childtune-d": 1.6}  # D: its Fisher pass (in the first update's time) costs about 0.6 of an update


def best_on_movie(rows):
    """{method: the name of its best setting} of a movie table's rows (summarize()), by TASK_METHODS' rule."""
    final = [r for r in rows if not r.get("stopped_at")]
    adam = next(r for r in final if r["method"] == "adam")
    best = {}
    for m in dict.fromkeys(r["method"] for r in final):
        cand = [r for r in final if r["method"] == m and not (m == "recadam" and r.get("gamma") == 0)]
        close = [r for r in cand if r["target_accuracy"] >= adam["target_accuracy"] - BEST_TOLERANCE]
        pick = min(close, key=lambda r: r["forgetting"]) if close else max(cand, key=lambda r: r["target_accuracy"])
        best[m] = pick["name"]
    return best


def make_grid(specs, gamma):
    """The settings to run, in the order given; errors name the spec."""
    grid = [methods.parse(s, gamma) for s in specs]
    if not grid:
        raise methods.MethodError("--methods: nothing to run")
    names = [methods.setting_name(g) for g in grid]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise methods.MethodError(f"--methods: a setting is given twice ({', '.join(twice)})")
    return grid


def planned_runs(opts, grid):
    """Every (setting, seed) to run: each setting at --seeds, the --third-seed ones also at the next seed."""
    third = {methods.setting_name(methods.parse(x, opts.gamma)) for x in opts.third_seed}
    return [(s, seed) for seed in opts.seeds for s in grid] + [
        (s, max(opts.seeds) + 1) for s in grid if methods.setting_name(s) in third]


def early_points(opts, setting):
    """The update counts < --updates measured from intermediate checkpoints (Adam's curve)."""
    if not opts.early_every or setting["method"] not in opts.early_methods:
        return []
    return list(range(opts.early_every, opts.updates, opts.early_every))


def cost(method: str) -> float:
    """An update of ``method`` relative to Adam's (COST)."""
    m = catalogue.get(method)
    return COST.get(m.name, COST.get(m.composed_of, 1.0))
