"""A search's Optuna side (scripts/glue/tune.sh): one study a method in a journal file that the trials' processes and a
cluster's shared disk can use (SAVE_DIR/TASK/search/journal.log: optuna-dashboard opens it), what the search was made
for (search.json: another task, metric, forgetting meter, METHODS, budget, first seed, ranges or sampler seed is
refused), one launcher at a time (tune.lock), and each trial drawn, told and read back as engine/trials.py reads it.

A trial's values (its variables: LR, K, T0, ...) are what its run trained with; they are kept with it, and rebuilt from
its drawn parameters when a launcher stopped between the two."""

import fcntl
import os
import zlib
from typing import Dict, List

from recadam_fairseq.engine.write import read_json, write_json

from .spec import Stop

JOURNAL = "journal.log"
STARTUP = 5  # a method's trials drawn at random until this many are complete, before TPE models its front
MADE_FOR = ("task", "metric", "forgetting_meter", "methods", "updates", "trial_seed", "spaces", "sampler_seed")
SHOWN = {"methods": "METHODS", "updates": "MAX_UPDATE", "trial_seed": "SEEDS' first", "sampler_seed": "SEARCH_SEED"}


class Studies:
    """The studies of a search in ``folder``: ``spaces`` ({method: launch/space.MethodSpace}), ``made_for`` (what
    search.json keeps: its task, the run's updates (t0's fractions are of them), the sampler's seed, ...)."""

    def __init__(self, folder: str, spaces: dict, made_for: dict):
        self.dir, self.spaces, self.made_for = folder, spaces, made_for
        self.task, self.updates, self.seed = made_for["task"], made_for["updates"], made_for["sampler_seed"]

    def open(self, say) -> None:
        """search.json checked (Stop: made for another search) and written; tune.lock taken (Stop: another launcher
        holds it; a file system without locks is said, not refused); the studies created or loaded."""
        import warnings

        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = os.path.join(self.dir, "search.json")
        theirs = read_json(path)
        if theirs is not None:
            differ = [k for k in MADE_FOR if theirs.get(k) != self.made_for[k]]
            if {"methods", "updates"} & set(differ):  # (the ranges differ with them: not said twice)
                differ = [k for k in differ if k != "spaces"]
            if differ:
                mine = self.made_for

                def shown(d):
                    parts = []
                    for k in differ:
                        if k == "spaces":
                            parts += [f"{m}'s ranges {d[k].get(m)}" for m in mine[k] if theirs[k].get(m) != mine[k][m]]
                        else:
                            parts.append(f"{SHOWN.get(k, k)} {' '.join(d[k]) if k == 'methods' else d[k]}")
                    return "; ".join(parts)
                raise Stop(f"{self.dir} holds a search made for {shown(theirs)}, not {shown(mine)}: give the same, or "
                           f"another SAVE_DIR")
        os.makedirs(self.dir, exist_ok=True)
        self.lock_file = open(os.path.join(self.dir, "tune.lock"), "w")
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Stop(f"another tune.sh runs the search in {self.dir} (it holds tune.lock)") from None
        except OSError as e:  # Lustre without flock, ...: nothing keeps a second launcher out
            say(f"warning: {self.dir} cannot be locked ({e.strerror}): run one tune.sh on it at a time")
        write_json(path, self.made_for)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.storage = JournalStorage(JournalFileBackend(os.path.join(self.dir, JOURNAL)))
        self.studies = {m: optuna.create_study(study_name=self.name(m), storage=self.storage, load_if_exists=True,
                                               directions=["maximize", "minimize"]) for m in self.spaces}

    def name(self, method: str) -> str:
        return f"{self.task}/{method}"

    def ask(self, method: str):
        """A new trial of ``method``: (its number, its variables), drawn by a sampler seeded from SEARCH_SEED, the method
        and the trials it has: a search that goes on draws no trial again."""
        import optuna

        n = len(self.studies[method].get_trials(deepcopy=False))
        seed = zlib.crc32(f"{self.seed}/{method}/{n}".encode()) & 0x7FFFFFFF
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP, multivariate=True, constant_liar=True)
        trial = optuna.load_study(study_name=self.name(method), storage=self.storage, sampler=sampler).ask()
        values = self.spaces[method].values(trial, self.updates)
        trial.set_user_attr("values", values)
        return trial.number, values

    def set_attr(self, method: str, number: int, key: str, value) -> None:
        study = self.studies[method]
        self.storage.set_trial_user_attr(self.storage.get_trial_id_from_study_id_trial_number(
            study._study_id, number), key, value)

    def tell(self, method: str, number: int, outcome: dict) -> None:
        """A trial's outcome (engine/trials.py's states): its two scores, or a failed trial with its reason."""
        from optuna.trial import TrialState

        self.set_attr(method, number, "outcome", outcome["state"])
        if outcome.get("reason"):
            self.set_attr(method, number, "reason", outcome["reason"])
        if outcome["state"] == "complete":
            self.studies[method].tell(number, [outcome["metric"], outcome["forgetting"]])
        else:
            self.studies[method].tell(number, state=TrialState.FAIL)

    def records(self) -> List[dict]:
        """Every trial of every method as engine/trials.py reads them; a running trial without its values (its
        launcher stopped while drawing them) has them rebuilt from its parameters, or none (``values`` {})."""
        from optuna.trial import TrialState

        out = []
        for m, space in self.spaces.items():
            for t in self.studies[m].get_trials(deepcopy=False):
                a = t.user_attrs
                state = {TrialState.COMPLETE: "complete", TrialState.FAIL: a.get("outcome", "failed")}.get(t.state,
                                                                                                         "running")
                values = a.get("values") or (space.values_of(t.params, self.updates) if all(
                    d.param in t.params for d in space.dims) else {})
                run_dir = a.get("run_dir", "")
                out.append({"method": m, "number": t.number, "state": state, "reason": a.get("reason", ""),
                            "values": values, "metric": t.values[0] if state == "complete" else None,
                            "forgetting": t.values[1] if state == "complete" else None, "run_dir": run_dir,
                            "setting": os.path.basename(os.path.dirname(run_dir))})
        return out


class Jobs:
    """The cluster jobs a search sent, by run directory (search/jobs.json): a launcher that died waits for them again."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "jobs.json")

    def read(self) -> Dict[str, str]:
        return read_json(self.path) or {}

    def add(self, run_dir: str, job_id: str) -> None:
        write_json(self.path, {**self.read(), run_dir: job_id})
