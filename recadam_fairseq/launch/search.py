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

import math
import os
import sys
import threading
from typing import Dict, List, Optional

from recadam_fairseq import catalogue
from recadam_fairseq.engine import trials as T
from recadam_fairseq.engine.execute import RunError

from . import glue, prelaunch, recipe, space
from .command import say_error
from .runs import INTERRUPTED, Runs, SpecJob, cluster_params, ended, interrupted_exit, run_name, sigterm_is_ctrl_c
from .spec import Conflict, RunSpec, Stop
from .study import JOURNAL, Jobs, Studies
from .variables import Variables

SCRIPT = "tune.sh"
DEFAULTS = {"METHODS": "adam recadam", "SEEDS": "1 2 3", "TRIALS": 10}


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
        prelaunch.methods_plans(self.methods, env)
        self.trials = v.whole("TRIALS", DEFAULTS["TRIALS"])
        self.seeds = [Variables({"SEEDS": s}, SCRIPT).whole("SEEDS", minimum=0) for s in words(v, "SEEDS")]
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
        # the task, its recipe, the data and checkpoint checked, their notes said (fp32 without CUDA) once
        self.updates = None
        base = self.build(self.methods[0], {}, say=v.say)
        self.task, self.metric = base.run_json["task"], base.run_json["metric"]
        # every method's trials run exactly this many updates (MAX_UPDATE, else the first method's recipe)
        self.updates = int(base.run_json["total_updates"])
        self.meter = v.get("FORGETTING_METER") or "mlm"
        layers = 0
        if space.needs_layers(self.methods):
            layers = int(recipe.checkpoint_arch(v, v.get("ROBERTA_PATH"), "ROBERTA_PATH").get("CKPT_LAYERS") or 0)
        self.spaces = space.spaces(self.methods, v.env, layers)
        batches = {m: self.build(m, {}).run_json["batch"] for m in self.methods}  # each method's own checks too
        if len(set(batches.values())) > 1:
            v.say(f"warning: the methods' recipes differ in batch ({', '.join(f'{m} {b}' for m, b in batches.items())})"
                  f": BATCH=N gives every trial the same")
        self.root = v.get("SAVE_DIR", "runs")
        self.dir = os.path.join(os.path.dirname(os.path.dirname(base.run_dir)), "search")
        self.study = Studies(self.dir, self.spaces, self.made_for())
        self.lock = threading.Lock()
        self.inflight: Dict[str, list] = {}  # run directories being trained: [set once ended, its exit status]
        self.active = {m: 0 for m in self.methods}  # trials under way (drawn, building, training)
        self.refused = {m: 0 for m in self.methods}  # (counted from the study in plan())
        self.capped: set = set()  # methods asked no more: TRIALS refusals
        self.fatal: Optional[str] = None  # a refusal every trial would meet
        self.runs = None

    # ------------------------------------------------------------------ runs
    def build(self, method: str, values: Dict[str, str], seed: Optional[int] = None, say=None) -> RunSpec:
        """The run of ``method`` at ``values`` (its variables: LR, K, T0, ...), named with its lr, ``self.updates``
        long; its notes to ``say`` (None: not said)."""
        env = {**self.v.env, **values, "SEED": str(self.trial_seed if seed is None else seed)}
        if self.updates is not None:
            env["MAX_UPDATE"] = str(self.updates)
        return glue.build(Variables(env, "finetune.sh", say=say or (lambda msg: None), cuda=self.cuda), self.task_arg,
                          method, self.extra, name_lr=True, t0_drawn=not self.v.get("T0"))

    def made_for(self) -> dict:
        return {"task": self.task, "metric": self.metric, "forgetting_meter": self.meter,
                "methods": sorted(self.methods, key=catalogue.position), "updates": self.updates,
                "trial_seed": self.trial_seed, "sampler_seed": self.sampler_seed,
                "spaces": {m: self.space_text(m) for m in sorted(self.spaces, key=catalogue.position)}}

    def space_text(self, method: str) -> str:
        """A method's search space in words: each range, then the knobs fixed by their variable."""
        s = self.spaces[method]
        fixed = [f"{catalogue.KNOBS[k].var}={v}" for k, v in s.pinned.items()]
        return ", ".join([f"{d.var} {d.shown(self.updates)}" for d in s.dims] + (["fixed " + " ".join(fixed)]
                                                                                    if fixed else []))

    # ------------------------------------------------------------------ a trial
    def outcome(self, spec: RunSpec, rc: int, offset: int) -> dict:
        """What a trial's run gave: its scores at the validation the engine picks, or why it has none (its log from
        byte ``offset``: this attempt's)."""
        from recadam_fairseq.engine.read import read_run

        from .train import REFUSAL, last_error

        if rc == INTERRUPTED or (rc != 0 and self.runs.stop.is_set()):  # (a second Ctrl-C's SIGTERM too)
            return {"state": "interrupted"}
        if rc != 0:  # its one-line refusal before training, a divergence (fairseq's FloatingPointError), or else
            error = last_error(os.path.join(spec.run_dir, "train.log"), offset) or f"fairseq-train exited with {rc}"
            refused = REFUSAL.match(error)
            state = "refused" if refused else "diverged" if "FloatingPointError" in error else "failed"
            return {"state": state, "reason": error[refused.end():] if refused else error}
        r = read_run(spec.run_dir, self.root)
        if r["best"] is None or r["forgetting"] is None:
            return {"state": "failed", "reason": r["note"] or "no forgetting in its validations (the probe's)"}
        if not (math.isfinite(r["best"]) and math.isfinite(r["forgetting"])):
            return {"state": "diverged", "reason": f"{self.metric} {r['best']}, forgetting {r['forgetting']}"}
        return {"state": "complete", "metric": r["best"], "forgetting": r["forgetting"]}

    def train(self, spec: RunSpec, say, name: str):
        """``spec`` trained, here or as a cluster job: (its exit status, 130 for Ctrl-C; where this attempt's log
        began). A run another trial of this search is training (two trials drawn to the same values) is waited for,
        and its status is this one's: nothing trains twice."""
        log = os.path.join(spec.run_dir, "train.log")
        offset = os.path.getsize(log) if os.path.exists(log) else 0
        with self.lock:
            busy = self.inflight.get(spec.run_dir)
            if busy is None:
                mine = self.inflight[spec.run_dir] = [threading.Event(), 1]
        if busy is not None:
            busy[0].wait()
            return busy[1], offset
        try:
            mine[1] = 0 if spec.done() else self.train_here(spec, say, name) if self.params is None else \
                self.train_there(spec, say, name)
            return mine[1], offset
        finally:
            with self.lock:
                self.inflight.pop(spec.run_dir)[0].set()

    def train_here(self, spec: RunSpec, say, name: str) -> int:
        v = Variables(self.v.env, "finetune.sh", say=lambda msg: say(f"finetune.sh: {msg}"))
        return self.runs.launch(spec, v, say, name, err=lambda text: None)  # (the trial's line says why)

    def train_there(self, spec: RunSpec, say, name: str) -> int:
        """As a cluster job, its id kept in search/jobs.json: a launcher that died waits for a SLURM job again (one
        still queued or running, or ended well), and sends another only when it failed. Ctrl-C leaves SLURM's jobs
        running and cancels CLUSTER=local's (they run on this machine)."""
        jobs = Jobs(self.dir)
        with self.lock:
            sent = jobs.read().get(spec.run_dir)
        job = None
        if sent and self.v.get("CLUSTER") == "slurm":
            job = self.runs.job(sent)
            if job.done() and job.state != "COMPLETED":
                job = None
        if job is None:
            job = self.runs.executor().submit(SpecJob(spec, self.runs.env))
            with self.lock:
                jobs.add(spec.run_dir, job.job_id)
            say(f"{SCRIPT}: {self.task}: {name} sent to {self.v.get('CLUSTER')} (job {job.job_id}; its log: "
                f"{job.paths.stdout})")
        why = self.runs.wait_job(job)
        if why == "interrupted" and self.v.get("CLUSTER") == "local":
            job.cancel(check=False)
        return INTERRUPTED if why == "interrupted" else 0 if why is None else 1

    def slot(self, method: str, orphan: Optional[dict] = None):
        """One of ``method``'s budget: a trial that trains (refusals are asked again, up to TRIALS of them);
        ``orphan``: a trial a killed launcher left running, whose run resumes."""
        def go(say):
            trial = (orphan["number"], orphan["values"]) if orphan else None
            while not self.runs.stop.is_set():
                with self.lock:
                    if trial is None:
                        if self.refused[method] >= self.trials:
                            if method not in self.capped:
                                say(f"{SCRIPT}: {self.task}: {method}: {self.refused[method]} trials refused, no more "
                                    f"asked: narrow its ranges (the reasons: {os.path.join(self.dir, 'trials.csv')})")
                            self.capped.add(method)
                            return None
                        trial = self.study.ask(method)
                    self.active[method] += 1
                number, values = trial
                outcome = self.attempt(method, number, values, say)
                with self.lock:
                    self.active[method] -= 1
                    if outcome["state"] == "interrupted":
                        self.runs.stop.set()  # left running in the study: the same command resumes it
                        return None
                    self.study.tell(method, number, outcome)
                    self.refused[method] += outcome["state"] == "refused"
                    self.report(method, number, values, outcome, say)
                    if outcome["state"] == "refused" and not any(v in outcome["reason"] for v in values.values()):
                        self.fatal = self.fatal or f"{method} #{number} refused, not for its values: {outcome['reason']}"
                        self.runs.stop.set()  # every trial would be: one line, not a refusal a trial
                if outcome["state"] != "refused":
                    return outcome
                trial = None
            return None
        return go

    def attempt(self, method: str, number: int, values: Dict[str, str], say) -> dict:
        """One trial's run: built (a Stop is a refusal), trained, read."""
        try:
            spec = self.build(method, values)
        except Stop as e:
            return {"state": "refused", "reason": str(e)}
        with self.lock:
            self.study.set_attr(method, number, "run_dir", spec.run_dir)
        try:
            spec.state()
        except Conflict as e:
            return {"state": "failed", "reason": str(e)}
        return self.outcome(spec, *self.train(spec, say, f"{method} #{number}"))

    def report(self, method: str, number: int, values: Dict[str, str], outcome: dict, say) -> None:
        """trials.csv rewritten; a line for the trial, the counts, each method's front so far."""
        recs = self.study.records()
        fronts = T.fronts(recs)
        self.write_csv(recs, fronts)
        trained = {m: T.trained(recs, m) for m in self.methods}
        running = sum(self.active.values())
        left = sum(max(0, self.trials - trained[m] - self.active[m]) for m in self.methods if m not in self.capped)
        shown = " ".join(f"{k}={v}" for k, v in values.items())
        what = (f"{self.metric} {outcome['metric']:.4g}, forgetting {outcome['forgetting'] + 0.0:+.3g}"
                if outcome["state"] == "complete" else outcome.get("reason", ""))
        say(f"{SCRIPT}: {self.task}: {method} #{number} {outcome['state']}: {what} ({shown}); {sum(trained.values())} "
            f"of {self.trials * len(self.methods)} trials ended, {running} running, {left} left")
        say(f"{SCRIPT}: {self.task}: fronts ({self.metric}/forgetting): "
            + "; ".join(f"{m} {T.front_text(f)}" for m, f in fronts.items()))

    def write_csv(self, recs: List[dict], fronts: Optional[dict] = None) -> None:
        from recadam_fairseq.engine.write import write_csv

        rows, fields = T.csv_rows(recs, fronts if fronts is not None else T.fronts(recs))
        tmp = os.path.join(self.dir, "trials.csv.tmp")
        write_csv(tmp, rows, fields)
        os.replace(tmp, os.path.join(self.dir, "trials.csv"))

    # ------------------------------------------------------------------ the whole
    def plan(self, recs: List[dict]):
        """The slots left, a method's after another's in turn: its orphans (resumed) first, then new trials up to
        TRIALS trained ones. An orphan its launcher stopped before it was drawn is told as refused (it never ran)."""
        per = {}
        for m in self.methods:
            orphans = [r for r in recs if r["method"] == m and r["state"] == "running"]
            for r in [r for r in orphans if not r["values"]]:
                self.study.tell(m, r["number"], {"state": "refused", "reason": "never drawn: its launcher stopped"})
            orphans = [r for r in orphans if r["values"]]
            trained = T.trained(recs, m)
            self.refused[m] = T.counts(recs, m).get("refused", 0)
            if trained > self.trials:
                raise Stop(f"TRIALS={self.trials}: the search has {trained} trials of {m} already: TRIALS only grows "
                           f"(another SAVE_DIR starts a search over)")
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

    def stopped(self) -> int:
        """The line after Ctrl-C (or a refusal every trial would meet), and the exit status."""
        if self.fatal:
            raise Stop(self.fatal)
        what = "the trials under way ended" if self.params is None else (
            "the local jobs were cancelled" if self.v.get("CLUSTER") == "local" else
            "the trials' jobs go on in SLURM, and the same command waits for them")
        return interrupted_exit(SCRIPT, what)

    def run(self) -> int:
        self.study.open(self.v.say)
        recs = self.study.records()
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
            return self.stopped()
        if self.runs.stop.is_set():
            return self.stopped()
        recs = self.study.records()
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
                rc, _ = self.train(s, say, run_name(s.run_dir))
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
            return self.stopped()
        if self.runs.stop.is_set():
            return self.stopped()
        self.summarize(recs, chosen, [s.run_dir for s in specs])
        return ended(SCRIPT, self.task, len(todo), len(specs) - len(todo), failed)

    def summarize(self, recs: List[dict], chosen: Dict[str, List[dict]], dirs: List[str]) -> None:
        """summary.md (the search's section, then the grid's summary and verdicts of the confirmed runs), its files,
        search-<TASK>.png."""
        from recadam_fairseq.engine import trials_plot, verdicts
        from recadam_fairseq.engine.aggregate import summarize
        from recadam_fairseq.engine.read import read_runs
        from recadam_fairseq.engine.write import write_summary

        runs = [r for d in dict.fromkeys(dirs) if os.path.isdir(d) for r in read_runs(d, self.root)]
        counted = [r for r in runs if r["status"] == "done"]
        best = T.reference(recs) if chosen.get("adam") else None  # Adam's best trial: its best-metric pick
        answers = verdicts.answer(counted, self.root, reference=best["setting"] if best else None)
        label = next((r["forgetting_metric"] for r in runs if r["forgetting_metric"]), self.meter)
        figure = f"search-{self.task}.png"
        meta = {"task": self.task, "metric": self.metric, "trials": self.trials, "updates": self.updates,
                "seed": self.sampler_seed, "trial_seed": self.trial_seed, "forgetting_metric": label,
                "floor": verdicts.floors(label)[0], "seeds": self.seeds, "methods": self.methods, "figure": figure,
                "spaces": {m: self.space_text(m) for m in self.methods}}
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
    sigterm_is_ctrl_c()
    try:
        return Search(argv[0], argv[1:], dict(os.environ)).run()
    except Stop as e:
        say_error(SCRIPT, e)
        return 2
    except KeyboardInterrupt:  # (before the trials: reading a checkpoint, the study)
        return interrupted_exit(SCRIPT, "nothing was under way")
