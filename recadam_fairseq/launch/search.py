"""scripts/glue/tune.sh TASK: each method at its best on the task, by a forgetting-aware search with equal budgets.

    scripts/glue/tune.sh TASK [extra fairseq-train args...]

For each of METHODS, TRIALS trials: each a run finetune.sh would make (glue.build: the same recipe, run directory
grammar, checkpoints and resume), its lr and its method's knobs drawn by Optuna's multi-objective TPE sampler
(launch/space.py's ranges), scored on two objectives the engine reads from its log (engine/read.py): the dev metric
(up) and forgetting (down), at the validation the summary picks. One Optuna study a method, in a journal file
(SAVE_DIR/TASK/search/journal.log) that several processes and a cluster's shared disk can use. Then each method's
picks from its front (engine/trials.py) are trained over SEEDS (the first seed's run is the trial's own) and judged
against Adam's best pick by the engine's rule (engine/verdicts.py): summary.md, trials.csv, the figures.

The same command goes on after a kill: complete trials are kept, a trial whose launcher died resumes its run from
its checkpoints, a higher TRIALS adds trials, and nothing trains twice (a run that is done is read). A trial the
plug-in refuses before training (a one-line error: RecAdam's overshooting pull, a combination it does not take) is
recorded with its reason and does not count against the budget, up to TRIALS refusals a method; one that fails or
diverges is recorded and counts."""

import fcntl
import json
import math
import os
import sys
import threading
import warnings
import zlib
from typing import Dict, List, Optional

from recadam_fairseq import catalogue
from recadam_fairseq.engine import trials as T
from recadam_fairseq.engine.execute import RunError

from . import glue, prelaunch, recipe, space
from .runs import INTERRUPTED, Runs, SpecJob, cluster_params, interrupted_exit
from .spec import Conflict, RunSpec, Stop
from .variables import Variables

SCRIPT = "tune.sh"
DEFAULTS = {"METHODS": "adam recadam", "SEEDS": "1 2 3", "TRIALS": 10}
STARTUP = 5  # a method's first trials are drawn at random, before TPE models its front
JOURNAL = "journal.log"  # Optuna's journal file: optuna-dashboard SAVE_DIR/TASK/search/journal.log
MADE_FOR = ("task", "metric", "forgetting_meter", "methods", "updates", "trial_seed")


def words(v: Variables, name: str) -> List[str]:
    out = (v.get(name) or str(DEFAULTS[name])).split()
    if not out:
        raise Stop(f"{name} must not be empty")
    if len(set(out)) != len(out):
        raise Stop(f"{name}={v.get(name)}: a value is named twice")
    return out


class Search:
    """One search: its variables checked and its trials' runs built before anything is written (Stop: one line)."""

    def __init__(self, task: str, extra: List[str], env: Dict[str, str]):
        v = self.v = Variables(env, SCRIPT)
        self.task_arg, self.extra = task, list(extra)
        for name, why in (("RESTART", "delete SAVE_DIR/TASK/search (and the trials' runs) to start a search over"),
                          ("DRY_RUN", "a search's trials depend on the scores of those before: "
                                      "grid.sh DRY_RUN=1 shows a run's command")):
            if v.get(name):
                raise Stop(f"{name}={v.get(name)}: not taken by tune.sh: {why}")
        self.methods = words(v, "METHODS")
        for m in self.methods:
            try:
                prelaunch.method_plan(m, env)
            except Stop as e:
                raise Stop(f"METHODS: {e}") from None
        self.trials = v.whole("TRIALS", DEFAULTS["TRIALS"])
        self.seeds = [int(Variables({"SEEDS": s}, SCRIPT).whole("SEEDS", minimum=0)) for s in words(v, "SEEDS")]
        self.trial_seed = self.seeds[0]
        self.sampler_seed = v.whole("SEARCH_SEED", 0, minimum=0)
        self.jobs, self.n_gpus = v.whole("JOBS", 1), v.whole("NUM_GPUS", 1)
        self.params = cluster_params(v, f"tune-{task}")
        self.cuda = bool(self.params["gpus_per_node"]) if v.get("CLUSTER") == "slurm" else None
        if not v.get("FORGETTING_PROBE"):
            raise Stop("FORGETTING_PROBE is not set: forgetting is the search's second objective (a probe directory "
                       "of scripts/binarize_probe.py)")
        for var in ("KS", "T0S"):
            if v.get(var):
                v.say(f"warning: {var}={v.get(var)} is grid.sh's: tune.sh searches k and t0 in K_RANGE and T0_RANGE "
                      f"(K or T0 fixes one)")
        # the task, its recipe, the data and checkpoint checked; the notes (fp32 without CUDA) said once, but T0's
        # at its default (each trial's is drawn inside the run)
        notes = []
        base = self.build(self.methods[0], {}, say=notes.append)
        for note in notes:
            if v.get("T0") or not note.startswith("warning: T0="):
                v.say(note)
        self.task, self.metric = base.run_json["task"], base.run_json["metric"]
        self.updates = int(base.run_json["total_updates"])
        self.meter = v.get("FORGETTING_METER") or "mlm"
        layers = 0
        if space.needs_layers(self.methods):
            layers = int(recipe.checkpoint_arch(v, v.get("ROBERTA_PATH"), "ROBERTA_PATH").get("CKPT_LAYERS") or 0)
        self.spaces = space.spaces(self.methods, v.env, layers)
        for m in self.methods[1:]:  # each method's own checks (LoRA's architecture, EWC's file, ...)
            self.build(m, {})
        self.root = v.get("SAVE_DIR", "runs")
        self.dir = os.path.join(os.path.dirname(os.path.dirname(base.run_dir)), "search")
        self.lock = threading.Lock()
        self.inflight: Dict[str, threading.Event] = {}  # run directories being trained: {run_dir: set once ended}
        self.storage = self.studies = self.runs = None

    # ------------------------------------------------------------------ runs
    def build(self, method: str, values: Dict[str, str], seed: Optional[int] = None, say=None) -> RunSpec:
        """The run of ``method`` at ``values`` (its variables: LR, K, T0, ...), named with its lr; its notes to
        ``say`` (None: not said)."""
        env = {**self.v.env, **values, "SEED": str(self.trial_seed if seed is None else seed)}
        return glue.build(Variables(env, "finetune.sh", say=say or (lambda msg: None), cuda=self.cuda), self.task_arg,
                          method, self.extra, name_lr=True)

    def made_for(self) -> dict:
        return {"task": self.task, "metric": self.metric, "forgetting_meter": self.meter,
                "methods": sorted(self.methods, key=catalogue.position), "updates": self.updates,
                "trial_seed": self.trial_seed}

    # ------------------------------------------------------------------ the study
    def open(self) -> None:
        """The search's directory: one made for another task, metric, forgetting meter, METHODS, budget or trial seed
        is refused; another tune.sh running it is refused; then Optuna's studies, one a method."""
        import optuna

        path = os.path.join(self.dir, "search.json")
        mine = self.made_for()
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                theirs = json.load(f)
            differ = [k for k in MADE_FOR if theirs.get(k) != mine[k]]
            if differ:
                shown = lambda d: ", ".join(f"{k} {' '.join(d[k]) if k == 'methods' else d[k]}" for k in differ)  # noqa
                raise Stop(f"{self.dir} holds a search made for {shown(theirs)}, not {shown(mine)} (MAX_UPDATE sets "
                           f"the updates, SEEDS' first the trials' seed): give the same, or another SAVE_DIR")
        os.makedirs(self.dir, exist_ok=True)
        self.lock_file = open(os.path.join(self.dir, "tune.lock"), "w")
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Stop(f"another tune.sh runs the search in {self.dir} (it holds tune.lock)") from None
        with open(path, "w", encoding="utf-8") as f:
            json.dump(mine, f, indent=1)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        self.storage = JournalStorage(JournalFileBackend(os.path.join(self.dir, JOURNAL)))
        self.studies = {m: optuna.create_study(study_name=self.study_name(m), storage=self.storage, load_if_exists=True,
                                               directions=["maximize", "minimize"]) for m in self.methods}

    def study_name(self, method: str) -> str:
        return f"{self.task}/{method}"

    def ask(self, method: str):
        """A new trial of ``method``: (its number, its variables), drawn by a sampler seeded from SEARCH_SEED, the method
        and the trials it has: the same command proposes the same trials, a resumed one no trial twice."""
        import optuna

        n = len(self.studies[method].get_trials(deepcopy=False))
        seed = zlib.crc32(f"{self.sampler_seed}/{method}/{n}".encode()) & 0x7FFFFFFF
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP, multivariate=True, constant_liar=True)
        study = optuna.load_study(study_name=self.study_name(method), storage=self.storage, sampler=sampler)
        trial = study.ask()
        values = self.spaces[method].values(trial, self.updates)
        trial.set_user_attr("values", values)
        return trial.number, values

    def set_attr(self, method: str, number: int, key: str, value) -> None:
        study = self.studies[method]
        self.storage.set_trial_user_attr(self.storage.get_trial_id_from_study_id_trial_number(
            study._study_id, number), key, value)

    def tell(self, method: str, number: int, outcome: dict) -> None:
        from optuna.trial import TrialState

        self.set_attr(method, number, "outcome", outcome["state"])
        if outcome.get("reason"):
            self.set_attr(method, number, "reason", outcome["reason"])
        if outcome["state"] == "complete":
            self.studies[method].tell(number, [outcome["metric"], outcome["forgetting"]])
        else:
            self.studies[method].tell(number, state=TrialState.FAIL)

    def records(self) -> List[dict]:
        """Every trial of every method as engine/trials.py reads them."""
        from optuna.trial import TrialState

        out = []
        for m in self.methods:
            for t in self.studies[m].get_trials(deepcopy=False):
                a = t.user_attrs
                state = {TrialState.COMPLETE: "complete", TrialState.FAIL: a.get("outcome", "failed")}.get(t.state,
                                                                                                         "running")
                run_dir = a.get("run_dir", "")
                out.append({"method": m, "number": t.number, "state": state, "reason": a.get("reason", ""),
                            "values": a.get("values", {}), "metric": t.values[0] if state == "complete" else None,
                            "forgetting": t.values[1] if state == "complete" else None, "run_dir": run_dir,
                            "setting": os.path.basename(os.path.dirname(run_dir))})
        return out

    # ------------------------------------------------------------------ a trial
    def outcome(self, spec: RunSpec, rc: int) -> dict:
        """What a trial's run gave: its scores at the validation the engine picks, or why it has none."""
        from recadam_fairseq.engine.read import read_run

        from .train import REFUSAL, last_error

        if rc == INTERRUPTED:
            return {"state": "interrupted"}
        if rc != 0:  # its one-line refusal before training, a divergence (fairseq's FloatingPointError), or else
            error = last_error(os.path.join(spec.run_dir, "train.log")) or f"fairseq-train exited with {rc}"
            refused = REFUSAL.match(error)
            state = "refused" if refused else "diverged" if "FloatingPointError" in error else "failed"
            return {"state": state, "reason": error[refused.end():] if refused else error}
        r = read_run(spec.run_dir, self.root)
        if r["best"] is None or r["forgetting"] is None:
            return {"state": "failed", "reason": r["note"] or "no forgetting in its validations (the probe's)"}
        if not (math.isfinite(r["best"]) and math.isfinite(r["forgetting"])):
            return {"state": "diverged", "reason": f"{self.metric} {r['best']}, forgetting {r['forgetting']}"}
        return {"state": "complete", "metric": r["best"], "forgetting": r["forgetting"]}

    def train(self, spec: RunSpec, say, name: str) -> int:
        """``spec`` trained, here or as a cluster job; its exit status, 130 for Ctrl-C. A run another trial of this
        search is training (two trials drawn to the same values) is waited for, then read: nothing trains twice."""
        with self.lock:
            busy = self.inflight.get(spec.run_dir)
            if busy is None:
                self.inflight[spec.run_dir] = threading.Event()
        if busy is not None:
            busy.wait()
            return 0 if spec.done() else 1
        try:
            return 0 if spec.done() else self.train_here(spec, say, name) if self.params is None else \
                self.train_there(spec, say, name)
        finally:
            with self.lock:
                self.inflight.pop(spec.run_dir).set()

    def train_here(self, spec: RunSpec, say, name: str) -> int:
        if os.path.exists(os.path.join(spec.run_dir, "train.log")):
            say(f"resume {spec.run_dir} (unfinished)")
        spec.write()
        (say if self.jobs == 1 else (lambda t: say(f"[{name}] {t}")))(spec.banner)
        return self.runs.train(spec, say, name)

    def train_there(self, spec: RunSpec, say, name: str) -> int:
        """As a cluster job, its id kept in search/jobs.json: a launcher that died waits for that job again (SLURM's:
        one still queued or running, or ended well), and sends another only when it failed."""
        path = os.path.join(self.dir, "jobs.json")
        with self.lock:
            sent = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}
        job = None
        if sent.get(spec.run_dir) and self.v.get("CLUSTER") == "slurm":
            job = self.runs.job(sent[spec.run_dir])
            if job.done() and job.state != "COMPLETED":
                job = None
        if job is None:
            job = self.runs.executor().submit(SpecJob(spec, self.runs.env))
            with self.lock:
                sent = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}
                sent[spec.run_dir] = job.job_id
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(sent, f, indent=1)
                os.replace(path + ".tmp", path)
            say(f"{SCRIPT}: {self.task}: {name} sent to {self.v.get('CLUSTER')} (job {job.job_id}; its log: "
                f"{job.paths.stdout})")
        why = self.runs.wait_job(job)
        return INTERRUPTED if why == "interrupted" else 0 if why is None else 1

    def slot(self, method: str, orphan: Optional[dict] = None):
        """One of ``method``'s budget: a trial that trains (refusals are asked again, up to TRIALS of them);
        ``orphan``: a trial a killed launcher left running, whose run resumes."""
        def go(say):
            trial = (orphan["number"], orphan["values"]) if orphan else None
            while not self.runs.stop.is_set():
                with self.lock:
                    if trial is None:
                        refused = T.counts(self.records(), method).get("refused", 0)
                        if refused >= self.trials:
                            say(f"{SCRIPT}: {self.task}: {method}: {refused} trials refused, no more asked: narrow "
                                f"its ranges (LR_RANGE, ...; the reasons: {os.path.join(self.dir, 'trials.csv')})")
                            return None
                        trial = self.ask(method)
                number, values = trial
                try:
                    spec = self.build(method, values)
                except Stop as e:
                    outcome = {"state": "refused", "reason": str(e)}
                else:
                    with self.lock:
                        self.set_attr(method, number, "run_dir", spec.run_dir)
                    try:
                        spec.state()
                        rc = self.train(spec, say, f"{method} #{number}")
                        outcome = self.outcome(spec, rc)
                    except Conflict as e:
                        outcome = {"state": "failed", "reason": str(e)}
                if outcome["state"] == "interrupted":
                    self.runs.stop.set()  # left running in the study: the same command resumes it
                    return None
                with self.lock:
                    self.tell(method, number, outcome)
                    self.report(method, number, values, outcome, say)
                if outcome["state"] != "refused":
                    return outcome
                trial = None
            return None
        return go

    def report(self, method: str, number: int, values: Dict[str, str], outcome: dict, say) -> None:
        """trials.csv rewritten; a line for the trial, the counts, each method's front so far."""
        recs = self.records()
        self.write_csv(recs)
        total = self.trials * len(self.methods)
        ended = sum(r["state"] in T.TRAINED for r in recs)
        running = self.jobs - len(self.runs.free) if self.params is None else sum(r["state"] == "running" for r in recs)
        shown = " ".join(f"{k}={v}" for k, v in values.items())
        what = (f"{self.metric} {outcome['metric']:.4g}, forgetting {outcome['forgetting']:+.3g}"
                if outcome["state"] == "complete" else outcome.get("reason", ""))
        say(f"{SCRIPT}: {self.task}: {method} #{number} {outcome['state']}: {what} ({shown}); {ended} of {total} "
            f"trials ended, {running} running, {max(0, total - ended - running)} left")
        say(f"{SCRIPT}: {self.task}: fronts ({self.metric}/forgetting): "
            + "; ".join(f"{m} {T.front_text(f)}" for m, f in T.fronts(recs).items()))

    def write_csv(self, recs: List[dict]) -> None:
        from recadam_fairseq.engine.write import write_csv

        rows, fields = T.csv_rows(recs, T.fronts(recs))
        tmp = os.path.join(self.dir, "trials.csv.tmp")
        write_csv(tmp, rows, fields)
        os.replace(tmp, os.path.join(self.dir, "trials.csv"))

    # ------------------------------------------------------------------ the whole
    def plan(self, recs: List[dict]):
        """The slots left, a method's after another's in turn: its orphans (resumed) first, then new trials up to
        TRIALS trained ones."""
        per = {}
        for m in self.methods:
            orphans = [r for r in recs if r["method"] == m and r["state"] == "running"]
            trained = sum(r["method"] == m and r["state"] in T.TRAINED for r in recs)
            n = max(self.trials - trained, len(orphans))
            per[m] = [self.slot(m, orphans[i] if i < len(orphans) else None) for i in range(n)]
        out = []
        for i in range(max((len(s) for s in per.values()), default=0)):
            out += [s[i] for s in per.values() if i < len(s)]
        return out

    def conflicts(self, recs: List[dict]) -> List[str]:
        """The trials' run directories started with another command (other extra args, another DATA_DIR...): a line
        each, before anything trains (as grid.sh)."""
        lines = []
        for r in recs:
            if r["state"] in ("complete", "running") and r["values"]:
                try:
                    self.build(r["method"], r["values"]).state()
                except Conflict as e:
                    lines.append(str(e))
        return lines

    def run(self) -> int:
        self.open()
        recs = self.records()
        clash = self.conflicts(recs)
        if clash:
            raise Stop("\n".join(clash))
        self.runs = Runs(self.v, self.jobs, self.n_gpus, self.params, os.path.join(self.dir, ".submitit"))
        plan = self.plan(recs)
        print(f"{SCRIPT}: {self.task}: {len(self.methods)} methods x {self.trials} trials of {self.updates} updates, "
              f"{self.jobs} at a time; {sum(r['state'] in T.TRAINED for r in recs)} ended before, {len(plan)} to run; "
              f"the study: {os.path.join(self.dir, JOURNAL)}", flush=True)
        try:
            self.runs.execute(plan)
        except KeyboardInterrupt:
            return interrupted_exit(SCRIPT, "the trials under way ended")
        if self.runs.stop.is_set():
            return interrupted_exit(SCRIPT, "the trials under way ended")
        recs = self.records()
        self.write_csv(recs)
        return self.confirm(recs)

    def confirm(self, recs: List[dict]) -> int:
        """Each method's picks over SEEDS (a seed's run that is done is read), then the summary."""
        from recadam_fairseq.engine import verdicts

        floor = verdicts.floors(self.meter)[0]  # (the metric's: 0.5 points)
        chosen = T.picks(recs, floor)
        if not any(chosen.values()):
            print(f"{SCRIPT}: {self.task}: no trial completed, nothing to confirm (why: "
                  f"{os.path.join(self.dir, 'trials.csv')})", file=sys.stderr, flush=True)
            return 1
        specs = [self.build(m, p["values"], seed) for m, ps in chosen.items() for p in ps for seed in self.seeds]
        todo = [s for s in specs if not s.done()]
        if todo:
            print(f"{SCRIPT}: {self.task}: confirming {sum(map(len, chosen.values()))} picks over seeds "
                  f"{' '.join(map(str, self.seeds))}: {len(todo)} runs", flush=True)

        def one(s):
            def go(say):
                try:
                    s.state()
                except Conflict as e:
                    raise RunError(str(e)) from None
                rc = self.train(s, say, os.path.relpath(s.run_dir, os.path.dirname(os.path.dirname(s.run_dir))))
                if rc == INTERRUPTED:
                    self.runs.stop.set()
                elif rc != 0:
                    say(f"{SCRIPT}: run failed: {s.run_dir}")
                    raise RunError(s.run_dir)
            return go

        failed = []
        try:
            self.runs.execute([one(s) for s in todo])
        except RunError as e:
            failed = str(e).split("\n\n")
        except KeyboardInterrupt:
            return interrupted_exit(SCRIPT, "the confirmation runs under way ended")
        if self.runs.stop.is_set():
            return interrupted_exit(SCRIPT, "the confirmation runs under way ended")
        self.summarize(recs, chosen, [s.run_dir for s in specs])
        if failed:
            print("".join(f"  failed: {d}\n" for d in failed), end="", file=sys.stderr)
            return 1
        return 0

    def summarize(self, recs: List[dict], chosen: Dict[str, List[dict]], dirs: List[str]) -> None:
        """summary.md (the search's section, then the grid's summary and verdicts of the confirmed runs), its files,
        search-<TASK>.png."""
        from recadam_fairseq.engine import trials_plot, verdicts
        from recadam_fairseq.engine.aggregate import summarize
        from recadam_fairseq.engine.read import read_runs
        from recadam_fairseq.engine.write import write_summary

        runs = [r for d in dict.fromkeys(dirs) if os.path.isdir(d) for r in read_runs(d, self.root)]
        counted = [r for r in runs if r["status"] == "done"]
        adam = chosen.get("adam") or []
        best = next((p for p in adam if "best metric" in p["why"]), None)
        answers = verdicts.answer(counted, self.root, reference=best["setting"] if best else None)
        label = next((r["forgetting_metric"] for r in runs if r["forgetting_metric"]), self.meter)
        figure = f"search-{self.task}.png"
        meta = {"task": self.task, "metric": self.metric, "trials": self.trials, "updates": self.updates,
                "seed": self.sampler_seed, "trial_seed": self.trial_seed, "forgetting_metric": label,
                "floor": verdicts.floors(label)[0], "seeds": self.seeds, "methods": self.methods, "figure": figure,
                "spaces": {m: ", ".join(f"{d.var} {d.shown(self.updates)}" for d in s.dims)
                           for m, s in self.spaces.items()}}
        head = T.markdown(recs, chosen, meta) + [f"![every trial of each method, its front and its picks]({figure})", ""]
        write_summary(self.dir, self.root, runs, summarize(counted), answers=answers, head=head)
        if trials_plot.plot(recs, chosen, self.methods, os.path.join(self.dir, figure),
                            {"x": f"forgetting: {label} since θ*, positive = forgot", "y": f"dev {self.metric}",
                             "title": f"{self.task}: every trial (dev {self.metric} against forgetting), each "
                                      f"method's front and picks"}):
            print(f"wrote {os.path.join(self.dir, figure)}, {os.path.join(self.dir, 'trials.csv')}", flush=True)


def main(argv: List[str]) -> int:
    if not argv:
        print(f"{SCRIPT}: error: expected TASK", file=sys.stderr)
        return 2
    try:
        return Search(argv[0], argv[1:], dict(os.environ)).run()
    except Stop as e:
        for line in str(e).splitlines():
            print(f"{SCRIPT}: error: {line}", file=sys.stderr, flush=True)
        return 2
